"""What the Slurm tests of deploy/slurm/ share: a one-host Slurm, small data, jobs, leftovers.

Stdlib only. Each test script makes a scratch directory, brings up a one-host Slurm in it with
tools/slurm-local.sh (3 node names on 127.0.0.1, 2 CPUs each), submits deploy/slurm/dmhnsw.sbatch
with sbatch, and in a `finally` stops the Slurm (`slurm-local.sh down`: jobs cancelled, daemons
stopped by pid) and SIGKILLs whatever process still names the scratch directory. A test exits 77
(skipped) only when Slurm is not installed here (slurm-local.sh exits 3). DMHNSW_KEEP_SCRATCH=1
keeps the scratch directory (job logs, job folders, the Slurm's logs) for a look afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

SKIP = 77


class TestFailure(Exception):
    pass


class Skip(Exception):
    pass


class Clock:
    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self, cap: float) -> float:
        left = self.deadline_s - self.elapsed()
        if left <= 0:
            raise TestFailure(f"the test ran out of its {self.deadline_s} s")
        return min(cap, left)

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)


def check(cond: bool, what: str, out: str = "") -> None:
    if not cond:
        raise TestFailure(what + (f"\n{out}" if out else ""))


def tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else f"({path}: none)"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes() -> dict[int, tuple[bytes, bytes]]:
    """Every process but this one: pid -> (command line, environment), NUL-separated."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            try:
                env = (p / "environ").read_bytes()
            except OSError:
                env = b""
            if alive(int(p.name)):
                out[int(p.name)] = (cmd, env)
        except OSError:
            pass
    return out


def shown(cmd: bytes) -> str:
    return cmd.replace(b"\0", b" ").decode(errors="replace")[:160]


class Harness:
    def __init__(self, name: str, deadline_s: float, bin_dir: Path, repo: Path) -> None:
        self.clock = Clock(deadline_s)
        self.log = self.clock.log
        self.bin_dir, self.repo = bin_dir, repo
        self.sbatch_script = repo / "deploy" / "slurm" / "dmhnsw.sbatch"
        self.slurm_local = repo / "tools" / "slurm-local.sh"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"dmhnsw-{name}-"))
        self.slurm_dir = self.tmp / "slurm"
        self.slurm_up = False
        self.env = dict(os.environ, SLURM_CONF=str(self.slurm_dir / "slurm.conf"))
        for k in [k for k in self.env if k.startswith(("DMHNSW_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if k != "SLURM_CONF":
                del self.env[k]

    # ---- processes ----

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None,
            cwd: Path | None = None) -> tuple[int, str]:
        try:
            r = subprocess.run(argv, cwd=cwd or self.tmp, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=self.clock.remaining(timeout), env=env or self.env)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            raise TestFailure(f"still running after {timeout} s: {' '.join(argv)}\n{out}") from None
        return r.returncode, r.stdout

    def must(self, argv: list[str], timeout: float = 120, env: dict | None = None) -> str:
        code, out = self.run(argv, timeout, env)
        check(code == 0, f"exit {code}: {' '.join(argv)}", out)
        return out

    # ---- the one-host Slurm ----

    def start_slurm(self) -> None:
        code, out = self.run(["bash", str(self.slurm_local), "up", "--dir", str(self.slurm_dir), "--nodes", "3",
                              "--cpus", "2", "--timeout", "60"], timeout=90)
        if code == 3:
            raise Skip(f"Slurm is not installed here (tools/install-deps.sh installs it): {out.strip()}")
        self.slurm_up = code == 0 or (self.slurm_dir / "daemons.pids").exists()
        check(code == 0, f"slurm-local.sh up: exit {code}", out)
        self.log("one-host Slurm up: " + " ".join(self.must(["sinfo", "-h", "-N", "-o", "%N:%t"]).split()))

    def stop_slurm(self) -> None:
        if not self.slurm_up:
            return
        code, out = self.run(["bash", str(self.slurm_local), "down", "--dir", str(self.slurm_dir)], timeout=90)
        self.log(f"slurm-local.sh down: exit {code}")
        if code != 0:
            print(out, flush=True)
        self.slurm_up = False

    # ---- data ----

    def data(self, n: int = 2000) -> None:
        b = self.bin_dir
        self.must([str(b / "datagen"), "--n", str(n), "--d", "16", "--clusters", "8", "--queries", "100",
                   "--out-base", "base.fvecs", "--out-queries", "queries.fvecs"])
        self.must([str(b / "groundtruth"), "--base", "base.fvecs", "--queries", "queries.fvecs", "--k", "10",
                   "--out", "gt.ivecs"])
        self.must([str(b / "workload"), "--queries", "queries.fvecs", "--groundtruth", "gt.ivecs", "--dist",
                   "zipf:0.99", "--count", "500", "--warmup", "50", "--out", "zipf.wl"])
        self.log("data made: 2000 x 16, 100 queries, a workload of 500")

    def job_env(self, **params: str) -> dict:
        env = dict(self.env, DMHNSW_BIN=str(self.bin_dir), DMHNSW_PROVIDER="tcp", DMHNSW_REGION="128MiB",
                   DMHNSW_HUGEPAGES="off", DMHNSW_READY_TIMEOUT="60", DMHNSW_STOP_TIMEOUT="20",
                   DMHNSW_DATA=str(self.tmp / "base.fvecs"), DMHNSW_WORKLOAD=str(self.tmp / "zipf.wl"),
                   DMHNSW_BUILD_ARGS="--m 16 --ef-construction 100 --threads 2 --coroutines 4",
                   DMHNSW_QUERY_ARGS="--k 10 --ef-search 64 --threads 1 --coroutines 4")
        for k, v in params.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    # ---- jobs ----

    # 2 memnode ids x 2 copies on 2 nodes, 1 computenode on the third
    HET = ["--nodes=2", "--ntasks=4", ":", "--nodes=1", "--ntasks=1"]

    def sbatch(self, env: dict, wait: bool, het: list[str] | None = None, timeout: float = 200) -> tuple[int, int, str]:
        """(exit code of sbatch, job id, its output)."""
        argv = ["sbatch", "--parsable"] + (["--wait"] if wait else []) + (het or self.HET) + [str(self.sbatch_script)]
        code, out = self.run(argv, timeout=timeout, env=env)
        m = re.search(r"^(\d+)", out, re.M)
        check(m is not None, f"sbatch printed no job id (exit {code})", out)
        return code, int(m.group(1)), out

    def sbatch_polled(self, env: dict, het: list[str] | None = None, cap: float = 200) -> tuple[int, int, str]:
        """As sbatch --wait, but polling the job's state every 0.5 s (sbatch --wait sleeps up to 10 s
        between its polls): (the job's exit code, job id, sbatch's output)."""
        code, job, out = self.sbatch(env, wait=False, het=het)
        check(code == 0, f"sbatch: exit {code}", out)
        return self.sbatch_polled_id(job, cap, out)

    def sbatch_polled_id(self, job: int, cap: float = 200, out: str = "") -> tuple[int, int, str]:
        """The end of a submitted job, polled as sbatch_polled does."""
        end = time.monotonic() + cap
        while True:
            code, text = self.run(["scontrol", "show", "job", str(job)], timeout=30)
            state = re.search(r"JobState=(\S+)", text)
            if code == 0 and state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                m = re.search(r"\bExitCode=(\d+):(\d+)", text)
                rc = int(m.group(1)) if m else -1
                return (rc if rc or state.group(1) == "COMPLETED" else 1), job, out
            if time.monotonic() >= end:
                raise TestFailure(f"job {job} still {state.group(1) if state else '?'} after {cap} s")
            self.clock.remaining(1)
            time.sleep(0.5)

    def job_dir(self, job: int) -> Path:
        return self.tmp / f"dmhnsw-{job}"

    def job_log(self, job: int) -> str:
        p = self.tmp / f"dmhnsw-{job}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def job_state(self, job: int) -> str:
        code, out = self.run(["scontrol", "show", "job", str(job)], timeout=30)
        m = re.search(r"JobState=(\S+)", out)
        return m.group(1) if code == 0 and m else ""

    def wait_job_gone(self, job: int, cap: float) -> None:
        """Until squeue lists no component of the job."""
        end = time.monotonic() + cap
        while time.monotonic() < end:
            code, out = self.run(["squeue", "-h", "-o", "%i %T"], timeout=30)
            if code == 0 and not [ln for ln in out.splitlines() if ln.split()[0].split("+")[0] == str(job)]:
                return
            time.sleep(0.5)
        raise TestFailure(f"job {job} still in squeue after {cap} s:\n{out}")

    def report_recall(self, path: Path) -> float:
        check(path.exists(), f"no query report {path}")
        rep = json.loads(path.read_text())
        return float(rep["runs"][0]["recall"])

    # ---- leftovers ----

    def leftovers(self, job: int) -> list[str]:
        """Processes of the job: naming its folder (command line), carrying it (DMH_JOBDIR in the
        environment: the batch script, sruns, task wrappers), or a slurmstepd of one of its components."""
        jd = str(self.job_dir(job)).encode()
        stepd = re.compile(rb"^slurmstepd: \[(%d|%d)[.+\]]" % (job, job + 1))
        out = []
        for pid, (cmd, env) in processes().items():
            if jd in cmd or b"DMH_JOBDIR=" + jd + b"\0" in env + b"\0" or stepd.match(cmd):
                out.append(f"pid {pid}: {shown(cmd)}")
        return out

    def check_no_leftovers(self, job: int, cap: float = 30) -> None:
        end = time.monotonic() + cap
        while True:
            left = self.leftovers(job)
            if not left:
                return
            if time.monotonic() >= end:
                raise TestFailure(f"job {job} left processes behind {cap} s after its end:\n" + "\n".join(left))
            time.sleep(0.5)

    def token_checks(self, job: int) -> None:
        """The job's token: mode 0600 in a folder of mode 0700, on no process's command line."""
        jd = self.job_dir(job)
        tok = jd / "cluster.token"
        check(tok.is_file(), f"no token file {tok}")
        check(tok.stat().st_mode & 0o777 == 0o600, f"{tok}: mode {oct(tok.stat().st_mode & 0o777)}, want 0600")
        check(jd.stat().st_mode & 0o777 == 0o700, f"{jd}: mode {oct(jd.stat().st_mode & 0o777)}, want 0700")
        secret = tok.read_text().strip().encode()
        check(len(secret) >= 40, f"{tok}: {len(secret)} characters, want a base64 of 32 bytes")
        leaks = [f"pid {pid}: {shown(cmd)}" for pid, (cmd, _) in processes().items() if secret in cmd]
        check(not leaks, "the token is on a command line:\n" + "\n".join(leaks))

    def copies_on_distinct_nodes(self, log_text: str, ids: int, copies: int) -> dict[tuple[int, int], str]:
        where = {(int(m.group(1)), int(m.group(2))): m.group(3)
                 for m in re.finditer(r"memnode (\d+) copy (\d+): \S+ on node (\S+)", log_text)}
        check(len(where) == ids * copies, f"the job log names {len(where)} memnode copies, want {ids * copies}",
              log_text)
        for i in range(ids):
            nodes = [where[(i, c)] for c in range(copies)]
            check(len(set(nodes)) == copies, f"copies of memnode {i} share a node: {nodes}", log_text)
        return where

    # ---- the end ----

    def cleanup(self) -> None:
        try:
            self.stop_slurm()
        except Exception as e:  # noqa: BLE001 - the kills below still run
            self.log(f"slurm-local.sh down in cleanup: {e}")
        mark = str(self.tmp).encode()
        for pid, (cmd, env) in processes().items():
            if mark in cmd or mark in env:
                self.log(f"killing leftover pid {pid}: {shown(cmd)}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def dump(self) -> None:
        for f in sorted(self.tmp.glob("dmhnsw-*.out")) + sorted(self.tmp.glob("dmhnsw-*/*.log")) + \
                sorted(self.slurm_dir.glob("log/*")):
            print(f"----- {f.relative_to(self.tmp)} (last 30 lines) -----\n{tail(f)}", flush=True)


def main(name: str, deadline_s: float, body: Callable[[Harness], None]) -> int:
    """argv: BIN_DIR REPO_ROOT. Runs body(harness); 0 passed, 1 failed, 77 skipped."""
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} BIN_DIR REPO_ROOT")
        return 2
    bin_dir, repo = (Path(a).resolve() for a in sys.argv[1:3])
    for f in ("memnode", "computenode", "datagen", "groundtruth", "workload"):
        if not (bin_dir / f).exists():
            print(f"FAIL: {bin_dir / f} is missing")
            return 1

    def on_signal(signum, _frame):
        raise TestFailure(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    h = Harness(name, deadline_s, bin_dir, repo)
    result = 1
    try:
        h.log(f"scratch {h.tmp}")
        h.start_slurm()
        body(h)
        result = 0
    except Skip as e:
        print(f"SKIPPED: {e}", flush=True)
        result = SKIP
    except TestFailure as e:
        print(f"FAIL: {e}", flush=True)
    except Exception as e:  # noqa: BLE001 - an error of the test itself still fails cleanly
        import traceback
        traceback.print_exc()
        print(f"FAIL: {type(e).__name__}: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if result == 1:
            h.dump()
        h.cleanup()
        if os.environ.get("DMHNSW_KEEP_SCRATCH") != "1":
            shutil.rmtree(h.tmp, ignore_errors=True)
    h.log({0: "PASS", SKIP: "SKIPPED"}.get(result, "FAILED"))
    return result
