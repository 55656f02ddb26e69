#!/usr/bin/env python3
"""deploy/slurm/dmhnsw.sbatch when memnodes do not come up, on a one-host Slurm.

    test_slurm_failures.py BIN_DIR REPO_ROOT

Job 1: every memnode refuses its --region (DMHNSW_REGION=12XB): the job fails at once (well
within its DMHNSW_READY_TIMEOUT of 60 s), its log naming ids 0 and 1 with the memnodes' own error.
Job 2: memnode 1 never comes up (a stand-in `memnode` that sleeps for id 1 and runs the real one
for id 0, through DMHNSW_BIN): the job fails after DMHNSW_READY_TIMEOUT=15 s and well before its
double, naming memnode 1 copy 0 and copy 1 and not id 0. Both: exits non-zero, the
job's state is FAILED, no process of it is left (the sleeping stand-ins included).
Stdlib only; exit 0 passed, 1 failed, 77 Slurm not installed.
"""

from __future__ import annotations

import os
import sys
import time

from slurm_harness import Harness, check, main

DEADLINE_S = 240  # below ctest's TIMEOUT (300), so that the script cleans up itself

FAKE_MEMNODE = """#!/usr/bin/env bash
# a memnode that never comes up for --id 1 (sleeps, its command line naming the job folder)
for ((i = 1; i < $#; i++)); do
  if [[ ${!i} == --id ]]; then j=$((i + 1)); id=${!j}; fi
done
if [[ ${id:-} == 1 ]]; then exec -a "memnode-stand-in $*" sleep 600; fi
exec REAL/memnode "$@"
"""


def body(h: Harness) -> None:
    (h.tmp / "base.fvecs").write_bytes(b"")  # never read: the memnodes fail before any build
    (h.tmp / "zipf.wl").write_bytes(b"")

    t0 = time.monotonic()
    code, job, out = h.sbatch_polled(h.job_env(DMHNSW_REPLICAS="2", DMHNSW_REGION="12XB", DMHNSW_READY_TIMEOUT="60"))
    took = time.monotonic() - t0
    text = h.job_log(job)
    h.log(f"job {job} (bad --region): exit {code} after {took:.1f} s")
    check(code != 0, f"job {job} with a bad region: exit 0", text)
    check(took < 45, f"job {job} took {took:.0f} s to fail, want well below its 60 s ready timeout", text)
    check("memnode id(s) 0, 1 exited before they were ready" in text, f"job {job}'s log names not ids 0 and 1", text)
    check("12XB" in text, f"job {job}'s log does not show the memnodes' own error about --region 12XB", text)
    check(h.job_state(job) in ("FAILED", ""), f"job {job}: state {h.job_state(job)}, want FAILED")
    h.wait_job_gone(job, 30)
    h.check_no_leftovers(job)

    fake = h.tmp / "fakebin"
    fake.mkdir()
    (fake / "memnode").write_text(FAKE_MEMNODE.replace("REAL", str(h.bin_dir)))
    (fake / "memnode").chmod(0o755)
    os.symlink(h.bin_dir / "computenode", fake / "computenode")
    t0 = time.monotonic()
    code, job, out = h.sbatch_polled(h.job_env(DMHNSW_REPLICAS="2", DMHNSW_BIN=str(fake), DMHNSW_READY_TIMEOUT="15"))
    took = time.monotonic() - t0
    text = h.job_log(job)
    h.log(f"job {job} (memnode 1 never ready): exit {code} after {took:.1f} s")
    check(code != 0, f"job {job} with memnode 1 never ready: exit 0", text)
    check(15 <= took < 30 + 20, f"job {job} took {took:.0f} s to fail, want its 15 s ready timeout (plus the stop)",
          text)
    check("memnode id(s) 1 not ready within DMHNSW_READY_TIMEOUT=15 s (memnode 1 copy 0, memnode 1 copy 1)" in text,
          f"job {job}'s log does not name memnode 1's copies", text)
    check("memnode 0 copy" not in text.split("not ready within", 1)[1].split("\n", 1)[0],
          f"job {job}'s log names memnode 0 among the missing", text)
    check(h.job_state(job) in ("FAILED", ""), f"job {job}: state {h.job_state(job)}, want FAILED")
    h.wait_job_gone(job, 30)
    h.check_no_leftovers(job)
    h.log(f"job {job}: failed naming memnode 1, nothing left")


if __name__ == "__main__":
    sys.exit(main("slurm-failures", DEADLINE_S, body))
