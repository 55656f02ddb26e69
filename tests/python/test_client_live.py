#!/usr/bin/env python3
"""End to end: the Python client (python/, pip-installed into a fresh virtualenv) against live
`computenode serve` endpoints of both modes, over real memnodes (tcp, cluster token), with the
bigann10k SIFT data.

    test_client_live.py BIN_DIR REPO_ROOT DATA_DIR

BIN_DIR holds memnode and computenode, REPO_ROOT is the repository (python/ and proto/ in it),
DATA_DIR the shared data directory (bigann10k/ in it). Stdlib only: the client side runs in
live_client.py, beside this file, under the python of the virtualenv that client_venv.py makes.

Steps: a fresh venv in the scratch directory with the client installed offline, from Debian's
packages only (client_venv.py: `python3 -m venv --system-site-packages`, then `pip install
--no-build-isolation --no-index` of a copy of python/ and proto/; no package registry is
contacted); 2 memnodes + a shine index (hnswlib's, through shine-import) + `serve`; 2 more
memnodes + a dhnsw index (10 partitions) + `serve --probe 4`; live_client.py against both (it also runs python/README.md's example);
SIGTERM to every process (each serve must exit 0). Every process is started in its own process
group, dies with this script (PR_SET_PDEATHSIG), and is killed in a `finally`, whatever happened.
Exit 0: passed; else a message and exit 1.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from client_venv import VenvFailure, clean_env, make_venv

TOKEN = "python-live-test-token"
DEADLINE_S = 560  # below ctest's TIMEOUT (600) so that this script cleans up itself
BUILD_TIMEOUT_S = 300
START_TIMEOUT_S = 120
CLIENT_TIMEOUT_S = 300

_start = time.monotonic()


class TestFailure(Exception):
    pass


def remaining(cap: float) -> float:
    left = DEADLINE_S - (time.monotonic() - _start)
    if left <= 0:
        raise TestFailure(f"the test ran out of its {DEADLINE_S} s")
    return min(cap, left)


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _start:6.1f}s] {msg}", flush=True)


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """In the child before exec: its own process group, and SIGKILL when this script dies."""
    os.setpgid(0, 0)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Cluster:
    """Every process this test started, stopped in `close()` whatever happened."""

    def __init__(self, bin_dir: Path, tmp: Path) -> None:
        self.bin_dir = bin_dir
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.env = dict(os.environ, DMHNSW_TOKEN=TOKEN)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        logfile = self.tmp / f"{name}.log"
        with open(logfile, "wb") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env or self.env, preexec_fn=_child_setup, cwd=self.tmp)
        self.procs.append((name, p, logfile))
        return p

    def run(self, name: str, argv: list[str], timeout: float) -> None:
        """Runs a command to its end; TestFailure with its output when it fails."""
        p = self.start(name, argv)
        try:
            code = p.wait(timeout=remaining(timeout))
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{name}: still running after {timeout} s\n{self.output(name)}") from None
        if code != 0:
            raise TestFailure(f"{name}: exit {code}: {' '.join(argv)}\n{self.output(name)}")

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def memnode(self, name: str, mid: int) -> str:
        """Starts a memnode (tcp, 256 MiB) and returns its control address once it is ready."""
        ready = self.tmp / f"{name}.ready"
        store = self.tmp / f"{name}.store"
        store.mkdir()
        p = self.start(name, [str(self.bin_dir / "memnode"), "--listen", "127.0.0.1:0", "--id", str(mid),
                              "--provider", "tcp", "--region", "256MiB", "--ready-file", str(ready),
                              "--store-dir", str(store)])
        end = time.monotonic() + remaining(30)
        while True:
            if ready.exists() and ready.read_text().strip():
                return ready.read_text().strip()
            if p.poll() is not None:
                raise TestFailure(f"{name}: exited at start ({p.returncode})\n{self.output(name)}")
            if time.monotonic() > end:
                raise TestFailure(f"{name}: not ready in 30 s\n{self.output(name)}")
            time.sleep(0.02)

    def computenode(self, mode: str, memnodes: str, rest: list[str]) -> list[str]:
        return [str(self.bin_dir / "computenode"), "--mode", mode, "--provider", "tcp", "--memnodes", memnodes,
                "--cn-id", "0", "--num-cns", "1", *rest]

    def serve(self, mode: str, memnodes: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
        """Starts `serve` on a free loopback port; returns it and the address it printed."""
        name = f"serve-{mode}"
        p = self.start(name, self.computenode(mode, memnodes, ["serve", "--listen", "127.0.0.1:0", *extra]))
        end = time.monotonic() + remaining(START_TIMEOUT_S)
        pattern = re.compile(rf"serving {mode} on (127\.0\.0\.1:\d+)")
        while True:
            m = pattern.search(self.output(name))
            if m:
                return p, m.group(1)
            if p.poll() is not None:
                raise TestFailure(f"{name}: exited at start ({p.returncode})\n{self.output(name)}")
            if time.monotonic() > end:
                raise TestFailure(f"{name}: no 'serving {mode} on' line in {START_TIMEOUT_S} s\n{self.output(name)}")
            time.sleep(0.05)

    def stop(self, p: subprocess.Popen, timeout: float = 30) -> int | None:
        """SIGTERM to the process group; SIGKILL after `timeout`. The exit code (None: killed)."""
        if p.poll() is not None:
            return p.returncode
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(p)
            return None

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        for target in (lambda: os.killpg(p.pid, signal.SIGKILL), p.kill):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Whatever still runs: SIGTERM, then SIGKILL (process groups, newest first)."""
        for name, p, _ in reversed(self.procs):
            if p.poll() is None:
                code = self.stop(p, timeout=10)
                log(f"stopped {name} (pid {p.pid}): exit {code}")

    def dump_logs(self) -> None:
        for name, _, logfile in self.procs:
            if logfile.exists():
                text = logfile.read_text(errors="replace").splitlines()
                print(f"----- {name}.log (last 30 lines) -----")
                print("\n".join(text[-30:]))


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    bin_dir, repo, data = (Path(a).resolve() for a in sys.argv[1:4])
    base = data / "bigann10k" / "bigann10k_base.bvecs"
    queries = data / "bigann10k" / "bigann10k_query.fvecs"
    groundtruth = data / "bigann10k" / "bigann10k_groundtruth.ivecs"
    client_script = Path(__file__).resolve().parent / "live_client.py"
    for f in (bin_dir / "memnode", bin_dir / "computenode", bin_dir / "hnswlib-bench", bin_dir / "shine-import", base, queries, groundtruth, client_script,
              repo / "python" / "setup.py", repo / "proto" / "dmhnsw.proto"):
        if not f.exists():
            print(f"FAIL: {f} is missing")
            return 1

    # a SIGTERM/SIGINT to this script (ctest, ^C) still runs the cleanup below
    def on_signal(signum, _frame):
        raise TestFailure(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    tmp = Path(tempfile.mkdtemp(prefix="dmhnsw-pylive-"))
    cluster = Cluster(bin_dir, tmp)
    ok = False
    try:
        log(f"scratch {tmp}")
        py = make_venv(repo, tmp, remaining, log)

        # shine: 2 memnodes, an hnswlib index imported into them (1 s; a shine build of the same
        # 10,000 vectors over tcp takes a minute of this test, and other tests cover it), serve
        mns = ",".join(cluster.memnode(f"shine-memnode{i}", i) for i in range(2))
        log(f"shine memnodes {mns}; building with hnswlib, importing")
        hnsw = tmp / "bigann10k.hnsw"
        cluster.run("hnswlib-build", [str(bin_dir / "hnswlib-bench"), "--base", str(base), "--queries", str(queries),
                                      "--groundtruth", str(groundtruth), "--ef-construction", "100", "--ef-search",
                                      "10", "--save", str(hnsw)], BUILD_TIMEOUT_S)
        cluster.run("shine-import", [str(bin_dir / "shine-import"), "--hnswlib", str(hnsw), "--data", str(base),
                                     "--provider", "tcp", "--memnodes", mns], BUILD_TIMEOUT_S)
        shine_serve, shine_addr = cluster.serve("shine", mns, [])
        log(f"shine built, serving on {shine_addr}")

        # dhnsw: 2 fresh memnodes, build with 10 partitions, serve probing 4
        mns = ",".join(cluster.memnode(f"dhnsw-memnode{i}", i) for i in range(2))
        log(f"dhnsw memnodes {mns}; building")
        cluster.run("dhnsw-build", cluster.computenode("dhnsw", mns, ["build", "--data", str(base),
                                                                    "--partitions", "10"]), BUILD_TIMEOUT_S)
        dhnsw_serve, dhnsw_addr = cluster.serve("dhnsw", mns, ["--probe", "4"])
        log(f"dhnsw built, serving on {dhnsw_addr}")

        # the client, in the venv, from the scratch directory (so no source tree shadows the install)
        log("running live_client.py in the venv")
        try:
            r = subprocess.run([str(py), str(client_script), "--token", TOKEN, "--queries", str(queries),
                                "--groundtruth", str(groundtruth), "--readme", str(repo / "python" / "README.md"),
                                "--not-grpc", mns.split(",")[0], f"shine={shine_addr}", f"dhnsw={dhnsw_addr}"],
                               cwd=tmp, env=dict(clean_env(), DMHNSW_TOKEN=TOKEN),
                               timeout=remaining(CLIENT_TIMEOUT_S), preexec_fn=_child_setup)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"live_client.py did not finish in {CLIENT_TIMEOUT_S} s") from None
        if r.returncode != 0:
            raise TestFailure(f"live_client.py failed (exit {r.returncode}), see its output above")

        # both services still up after all that, then SIGTERM: each must exit 0
        for name, p in (("serve-shine", shine_serve), ("serve-dhnsw", dhnsw_serve)):
            if p.poll() is not None:
                raise TestFailure(f"{name} exited during the client's calls ({p.returncode})\n{cluster.output(name)}")
        for name, p in (("serve-shine", shine_serve), ("serve-dhnsw", dhnsw_serve)):
            code = cluster.stop(p, timeout=30)
            if code != 0:
                raise TestFailure(f"{name}: exit {code} after SIGTERM (want 0)\n{cluster.output(name)}")
            log(f"{name}: SIGTERM, exit 0")
        ok = True
    except (TestFailure, VenvFailure) as e:
        print(f"FAIL: {e}", flush=True)
    except Exception as e:  # noqa: BLE001 - an error of the test itself still fails cleanly
        print(f"FAIL: {type(e).__name__}: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.close()
        if not ok:
            cluster.dump_logs()
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
