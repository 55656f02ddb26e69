#!/usr/bin/env python3
"""deploy/slurm/dmhnsw.sbatch with DMHNSW_WORK=serve on a one-host Slurm, queried, then scancel.

    test_slurm_serve.py BIN_DIR REPO_ROOT

The Python client (python/) in a fresh virtualenv, installed offline as tests/python does
(client_venv.py). A serve job: 2 memnode ids x 2 copies over tcp on component 0 (2 nodes), one
`computenode serve` on component 1, a shine build of 2,000 x 16 vectors first. Once the job's log
prints its gRPC address: the token is mode 0600 in a folder of mode 0700 and on no command line;
every query of the data set asked through the client with the job's token, recall@10 >= 0.9
against the exact neighbours; a wrong token refused. Then `scancel`: the job leaves squeue within
30 s, its state CANCELLED, and no process of it is left (none naming its folder or carrying it
in its environment, no slurmstepd of it). A second serve job listens on Slurm's NodeAddr
(DMHNSW_ADDR=slurm) and stores the index (DMHNSW_STORE) when `scancel --batch --signal=USR1`
ends it: queried as above, then COMPLETED with one image per id, serve stopped before the
memnodes, every memnode exited 0, nothing left. Stdlib only here; exit 0 passed, 1 failed, 77
Slurm not installed.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from slurm_harness import Harness, TestFailure, check, main

DEADLINE_S = 280  # below ctest's TIMEOUT (300), so that the script cleans up itself
MIN_RECALL = 0.9

CLIENT = r"""
import sys
import numpy as np
import grpc
import dmhnsw

addr, token_file, queries_path, gt_path = sys.argv[1:5]


def read_vecs(path, dtype):
    raw = np.fromfile(path, dtype="<i4")
    dim = int(raw[0])
    return raw.reshape(-1, dim + 1)[:, 1:].copy().view(dtype)


token = open(token_file).readline().strip()
queries = read_vecs(queries_path, "<f4")
gt = read_vecs(gt_path, "<i4")
with dmhnsw.Client(addr, token=token, timeout=60) as client:
    info = client.info()
    print("info", info.mode, info.dim, info.count, flush=True)
    ids, _ = client.search(queries, k=10)
hits = sum(len(set(ids[i].tolist()) & set(gt[i][:10].tolist())) for i in range(len(queries)))
print(f"recall {hits / (10 * len(queries)):.4f} over {len(queries)} queries", flush=True)
try:
    with dmhnsw.Client(addr, token="not-the-token", timeout=30) as client:
        client.search(queries[:1], k=10)
    print("wrong token: answered", flush=True)
except Exception as e:  # the client's Unauthenticated error
    print("wrong token: refused", type(e).__name__, flush=True)
"""


def wait_serving(h: Harness, job: int, t0: float) -> str:
    """The gRPC address the job's log prints once computenode 0 serves."""
    while True:
        text = h.job_log(job)
        m = re.search(r"serving: gRPC at (\S+) \(computenode 0", text)
        if m:
            h.log(f"job {job} serves on {m.group(1)} after {time.monotonic() - t0:.1f} s from sbatch")
            return m.group(1)
        state = h.job_state(job)
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise TestFailure(f"job {job} ended ({state}) before it served:\n{text}")
        h.clock.remaining(1)
        if time.monotonic() - t0 > 150:
            raise TestFailure(f"job {job} printed no gRPC address within 150 s:\n{text}")
        time.sleep(0.5)


def query(h: Harness, py: Path, env: dict, job: int, addr: str) -> None:
    token = h.job_dir(job) / "cluster.token"
    code, out = h.run([str(py), str(h.tmp / "client.py"), addr, str(token), str(h.tmp / "queries.fvecs"),
                       str(h.tmp / "gt.ivecs")], timeout=120, env=env)
    h.log("client: " + " | ".join(out.strip().splitlines()[-3:]))
    check(code == 0, f"the client failed (exit {code})", out)
    m = re.search(r"^recall (\S+) over 100 queries", out, re.M)
    check(m is not None and float(m.group(1)) >= MIN_RECALL, f"recall@10 through serve below {MIN_RECALL}", out)
    check("wrong token: refused" in out, "a wrong token was not refused", out)


def body(h: Harness) -> None:
    sys.path.insert(0, str(h.repo / "tests" / "python"))
    from client_venv import VenvFailure, clean_env, make_venv  # noqa: E402 - beside the Python client's tests

    h.data()
    try:
        py = make_venv(h.repo, h.tmp, h.clock.remaining, h.log)
    except VenvFailure as e:
        raise TestFailure(f"the Python client does not install offline: {e}") from None
    (h.tmp / "client.py").write_text(CLIENT)

    # 1: serve until scancel
    t0 = time.monotonic()
    code, job, out = h.sbatch(h.job_env(DMHNSW_WORK="serve", DMHNSW_REPLICAS="2"), wait=False)
    check(code == 0, f"sbatch: exit {code}", out)
    h.log(f"job {job} submitted (serve, ended by scancel)")
    addr = wait_serving(h, job, t0)
    h.copies_on_distinct_nodes(h.job_log(job), 2, 2)
    h.token_checks(job)
    running = h.leftovers(job)  # the detector of what a job leaves behind sees it while it runs
    check(sum("memnode" in p for p in running) >= 4 and any("serve" in p for p in running),
          f"while job {job} serves, its processes are not all seen:\n" + "\n".join(running))
    query(h, py, clean_env(), job, addr)
    t1 = time.monotonic()
    h.must(["scancel", str(job)], timeout=30)
    h.wait_job_gone(job, 30)
    h.log(f"scancel {job}: out of squeue after {time.monotonic() - t1:.1f} s")
    state = h.job_state(job)
    check(state in ("CANCELLED", ""), f"job {job}: state {state} after scancel, want CANCELLED")
    h.check_no_leftovers(job)
    text = h.job_log(job)
    check("SIGTERM" in text, f"job {job}'s log does not show the SIGTERM of scancel", text)
    h.log(f"job {job}: nothing left after scancel")

    # 2: serve on Slurm's node addresses (DMHNSW_ADDR=slurm: 127.0.0.1 here), ended in order by a
    # USR1 to the batch script, which stores the index first
    images = h.tmp / "images"
    t0 = time.monotonic()
    code, job, out = h.sbatch(h.job_env(DMHNSW_WORK="serve", DMHNSW_REPLICAS="2", DMHNSW_ADDR="slurm",
                                        DMHNSW_STORE=str(images)), wait=False)
    check(code == 0, f"sbatch: exit {code}", out)
    h.log(f"job {job} submitted (serve on NodeAddr, ended by USR1 with a store)")
    addr = wait_serving(h, job, t0)
    check(addr.startswith("127.0.0.1:"), f"job {job} serves on {addr}, not on its node's NodeAddr 127.0.0.1")
    query(h, py, clean_env(), job, addr)
    t1 = time.monotonic()
    h.must(["scancel", "--batch", "--signal=USR1", str(job)], timeout=30)
    h.wait_job_gone(job, 60)
    h.log(f"scancel --batch --signal=USR1 {job}: out of squeue after {time.monotonic() - t1:.1f} s")
    text = h.job_log(job)
    state = h.job_state(job)
    check(state in ("COMPLETED", ""), f"job {job}: state {state} after USR1, want COMPLETED", text)
    for i in range(2):
        check((images / f"memnode-{i}.img").is_file(), f"job {job} stored no memnode-{i}.img", text)
    order = [text.find(s) for s in ("USR1: ending the service", "stored: memnode-0.img memnode-1.img",
                                    "stopping the serving computenodes", "stopping the memnodes")]
    check(-1 not in order and order == sorted(order), f"job {job} did not store, stop serve, stop memnodes in order",
          text)
    for i in range(2):
        for c in range(2):
            ex = h.job_dir(job) / f"mn{i}.{c}.exit"
            check(ex.is_file() and ex.read_text().strip() == "0", f"memnode {i} copy {c} did not exit 0 on SIGTERM",
                  text)
    h.check_no_leftovers(job)
    h.log(f"job {job}: stored, stopped in order, nothing left")


if __name__ == "__main__":
    sys.exit(main("slurm-serve", DEADLINE_S, body))
