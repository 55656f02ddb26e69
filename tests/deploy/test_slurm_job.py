#!/usr/bin/env python3
"""deploy/slurm/dmhnsw.sbatch end to end on a one-host Slurm: build, query, store, load.

    test_slurm_job.py BIN_DIR REPO_ROOT

A one-host Slurm (tools/slurm-local.sh: 3 node names on 127.0.0.1). Job 1, `sbatch --wait` of the
heterogeneous job: 2 memnode ids x 2 copies over tcp (128 MiB regions) on component 0 (2 nodes),
1 computenode on component 1 (the third): a shine build of 2,000 x 16 vectors and the workload,
then the index stored (DMHNSW_STORE). Checks: exit 0; recall@10 >= 0.9 in the job folder's
query.json; copies of each id on distinct nodes; the work on component 1's node; one image per
id; the job's token removed at its end; no process of the job left (none naming its folder or
carrying it in its environment, no slurmstepd of it). Job 2 loads the images (DMHNSW_LOAD, no
build) and runs the same workload: per efSearch (64 and 10) the same recall and the same nodes
visited and lists used per query. Job 3 loads them too and queries for 8 s;
memnode 1 copy 0 is SIGKILLed 2 s into them: the job ends 0, no query failed, recall >= 0.9,
its log reports the copy's exit. Stdlib only; exit 0 passed, 1 failed, 77 Slurm
not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from slurm_harness import Harness, check, main, processes

DEADLINE_S = 270  # below ctest's TIMEOUT (300), so that the script cleans up itself
MIN_RECALL = 0.9


def body(h: Harness) -> None:
    h.data()
    images = h.tmp / "images"

    t0 = time.monotonic()
    query_args = "--k 10 --ef-search 64,10 --threads 1 --coroutines 4"
    # Polled every 0.5 s rather than `sbatch --wait` (which sleeps up to 10 s between its polls:
    # 42 s for a job of 18 s); the job is the same.
    code, job, out = h.sbatch_polled(h.job_env(DMHNSW_REPLICAS="2", DMHNSW_STORE=str(images),
                                               DMHNSW_QUERY_ARGS=query_args))
    log1 = h.job_log(job)
    h.log(f"job {job} (build, query, store): exit {code} after {time.monotonic() - t0:.1f} s")
    check(code == 0, f"job {job}: exit {code}, want 0", out + "\n" + log1)
    check(h.job_state(job) in ("COMPLETED", ""), f"job {job}: state {h.job_state(job)}, want COMPLETED")
    recall1 = h.report_recall(h.job_dir(job) / "query.json")
    h.log(f"job {job}: recall@10 {recall1:.4f}")
    check(recall1 >= MIN_RECALL, f"job {job}: recall@10 {recall1} below {MIN_RECALL}", log1)
    where = h.copies_on_distinct_nodes(log1, 2, 2)
    m = re.search(r"computenode\(s\) on component 1 \((\S+)\)", log1)
    check(m is not None and m.group(1) not in where.values(),
          f"the computenode's node {m.group(1) if m else '?'} is one of the memnodes' {sorted(set(where.values()))}",
          log1)
    for i in range(2):
        img = images / f"memnode-{i}.img"
        check(img.is_file() and img.stat().st_size > 0, f"job {job} stored no {img}", log1)
    check(not (h.job_dir(job) / "cluster.token").exists(), f"job {job} left its token behind")
    check(not list(h.job_dir(job).glob("*.addr")), f"job {job} left ready files behind")
    h.wait_job_gone(job, 30)
    h.check_no_leftovers(job)
    h.log(f"job {job}: copies on distinct nodes {where}, images stored, no process left")

    t0 = time.monotonic()
    code, job2, out = h.sbatch_polled(h.job_env(DMHNSW_REPLICAS="2", DMHNSW_LOAD=str(images), DMHNSW_DATA=None,
                                                DMHNSW_QUERY_ARGS=query_args))
    log2 = h.job_log(job2)
    h.log(f"job {job2} (load, query): exit {code} after {time.monotonic() - t0:.1f} s")
    check(code == 0, f"job {job2}: exit {code}, want 0", out + "\n" + log2)
    check("building" not in log2, f"job {job2} built an index although it loaded one", log2)
    # the same index searched the same way: per efSearch, the same recall and the same nodes visited
    same = []
    for j in (job, job2):
        rep = json.loads((h.job_dir(j) / "query.json").read_text())
        same.append([(r["ef_search"], r["recall"], r["per_query"]["visited"], r["per_query"]["hops"])
                     for r in rep["runs"]])
    h.log(f"job {job2}: (efSearch, recall, visited, hops) {same[1]}; job {job}: {same[0]}")
    check(same[0] == same[1], f"the loaded index answers otherwise than the stored one: {same[1]} against {same[0]}")
    h.wait_job_gone(job2, 30)
    h.check_no_leftovers(job2)

    # 3: the images again, queries for 8 s, and memnode 1 copy 0 SIGKILLed 2 s into them: its
    # copy 1 answers for it, so every query succeeds
    t0 = time.monotonic()
    code, job3, out = h.sbatch(h.job_env(DMHNSW_REPLICAS="2", DMHNSW_LOAD=str(images), DMHNSW_DATA=None,
                                         DMHNSW_QUERY_ARGS="--k 10 --ef-search 64 --threads 1 --coroutines 4 "
                                                           "--repeat-seconds 8"), wait=False)
    check(code == 0, f"sbatch: exit {code}", out)
    while "dmhnsw: querying" not in h.job_log(job3):
        check(h.job_state(job3) in ("PENDING", "CONFIGURING", "RUNNING", ""), f"job {job3} ended before it queried",
              h.job_log(job3))
        check(time.monotonic() - t0 < 90, f"job {job3} did not query within 90 s", h.job_log(job3))
        h.clock.remaining(1)
        time.sleep(0.2)
    time.sleep(2)
    victim = [pid for pid, (cmd, _) in processes().items()
              if cmd.startswith(str(h.bin_dir / "memnode").encode() + b"\0")
              and str(h.job_dir(job3)).encode() in cmd and b"\0--id\x001\0" in cmd and b"\0--copy\x000\0" in cmd]
    check(len(victim) == 1, f"found {len(victim)} processes of memnode 1 copy 0 of job {job3}, want 1")
    os.kill(victim[0], signal.SIGKILL)
    h.log(f"job {job3}: SIGKILLed memnode 1 copy 0 (pid {victim[0]}) during its queries")
    code, _, _ = h.sbatch_polled_id(job3)
    log3 = h.job_log(job3)
    h.log(f"job {job3} (load, queries, a copy killed): exit {code} after {time.monotonic() - t0:.1f} s")
    check(code == 0, f"job {job3}: exit {code}, want 0", log3)
    rep = json.loads((h.job_dir(job3) / "query.json").read_text())
    run = rep["runs"][0]
    # a query that fails fails the computenode (exit 1): exit 0 means every query was answered
    check(run["queries"] >= 450, f"job {job3}: {run['queries']} queries measured, want the workload's 450 or more",
          log3)
    check(run["recall"] >= MIN_RECALL, f"job {job3}: recall@10 {run['recall']} below {MIN_RECALL}", log3)
    check("memnode 1 copy 0 exited with code 137" in log3, f"job {job3}'s log does not report the killed copy", log3)
    h.log(f"job {job3}: {run['queries']} queries, recall@10 {run['recall']:.4f}, none failed")
    h.wait_job_gone(job3, 30)
    h.check_no_leftovers(job3)


if __name__ == "__main__":
    sys.exit(main("slurm-job", DEADLINE_S, body))
