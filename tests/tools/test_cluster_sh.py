#!/usr/bin/env python3
"""tools/cluster.sh, run as a new user would: up, status, serve, down, on real memnodes.

    test_cluster_sh.py BIN_DIR REPO_ROOT

BIN_DIR holds memnode, computenode, datagen, groundtruth and workload; REPO_ROOT has
tools/cluster.sh. Stdlib only.

Steps, in a scratch directory: small data (datagen, groundtruth, workload); `up` of 2 memnodes
(shm) and its cluster.env and cluster.pids; a shine build and a query through the sourced
cluster.env; `status` (2 memnodes alive, headers of mode shine); `serve shine` (serve.addr,
SERVE=, its pid alive); a second `up` on the same directory refused; `down` (every pid gone,
its files gone), then `status` exits 2 and `down` again exits 0. Then a replica set over tcp
(1 id x 2 copies) after a stale cluster.pids: the token file (mode 0600, in no process's
command line), `status`, `down`. Whatever happens, a `finally` runs `down` and SIGKILLs every
process whose command line names the scratch directory.
Exit 0: passed; else what failed and exit 1.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEADLINE_S = 230  # below ctest's TIMEOUT (300), so that this script cleans up itself
_start = time.monotonic()


class TestFailure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{time.monotonic() - _start:6.1f}s] {msg}", flush=True)


def remaining(cap: float) -> float:
    left = DEADLINE_S - (time.monotonic() - _start)
    if left <= 0:
        raise TestFailure(f"the test ran out of its {DEADLINE_S} s")
    return min(cap, left)


def run(argv: list[str], cwd: Path, timeout: float = 120, env: dict | None = None) -> tuple[int, str]:
    """Runs argv to its end; (exit code, stdout and stderr together)."""
    try:
        r = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace", timeout=remaining(timeout),
                           env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise TestFailure(f"still running after {timeout} s: {' '.join(argv)}\n{out}") from None
    return r.returncode, r.stdout


def must(argv: list[str], cwd: Path, timeout: float = 120) -> str:
    code, out = run(argv, cwd, timeout)
    if code != 0:
        raise TestFailure(f"exit {code}: {' '.join(argv)}\n{out}")
    return out


def check(cond: bool, what: str, out: str = "") -> None:
    if not cond:
        raise TestFailure(what + (f"\n{out}" if out else ""))


def alive(pid: int) -> bool:
    """The process exists and is no zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdlines() -> dict[int, bytes]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = (p / "cmdline").read_bytes()
            except OSError:
                pass
    return out


def pids_of(cdir: Path) -> dict[str, int]:
    """cluster.pids as {"memnode 0 0": pid, "serve shine": pid}."""
    out = {}
    for line in (cdir / "cluster.pids").read_text().splitlines():
        f = line.split()
        if f[0] == "memnode":
            out[" ".join(f[:3])] = int(f[3])
        elif f[0] == "serve":
            out[" ".join(f[:2])] = int(f[2])
        else:
            raise TestFailure(f"cluster.pids: unexpected line {line!r}")
    return out


def read_env(cdir: Path, tmp: Path) -> dict[str, str]:
    """cluster.env as a shell sees it once sourced."""
    out = must(["bash", "-c", 'source "$1" && for v in MEMNODES PROVIDER TOKEN_FILE CLUSTER_DIR SERVE; do '
                'printf "%s=%s\\n" "$v" "${!v-}"; done', "env", str(cdir / "cluster.env")], tmp)
    return dict(line.split("=", 1) for line in out.splitlines())


class Test:
    def __init__(self, bin_dir: Path, repo: Path, tmp: Path) -> None:
        self.bin_dir, self.tmp = bin_dir, tmp
        self.script = repo / "tools" / "cluster.sh"
        self.seen: set[int] = set()  # every pid a cluster.pids named

    def sh(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        extra = ["--bin", str(self.bin_dir)] if args[0] in ("up", "serve", "status") else []
        code, out = run(["bash", str(self.script), *args, *extra], self.tmp, timeout)
        log(f"cluster.sh {' '.join(args)}: exit {code}")
        return code, out

    def live_pids(self, cdir: Path, want: dict[str, int]) -> dict[str, int]:
        pids = pids_of(cdir)
        self.seen.update(pids.values())
        for key, n in want.items():
            got = [p for k, p in pids.items() if k.startswith(key)]
            check(len(got) == n, f"cluster.pids names {len(got)} {key} process(es), want {n}: {pids}")
        for k, p in pids.items():
            check(alive(p), f"cluster.pids: {k} pid {p} does not run")
        return pids

    def check_down(self, cdir: Path, pids: dict[str, int]) -> None:
        code, out = self.sh("down", "--dir", str(cdir))
        check(code == 0, f"down: exit {code}", out)
        left = [f"{k} pid {p}" for k, p in pids.items() if alive(p)]
        check(not left, f"after down still running: {left}", out)
        for f in ("cluster.pids", "cluster.env"):
            check(not (cdir / f).exists(), f"after down {cdir / f} still exists")
        check(not list(cdir.glob("*.addr")), f"after down {cdir} still has ready files")
        code, out = self.sh("status", "--dir", str(cdir))
        check(code == 2, f"status after down: exit {code}, want 2", out)
        code, out = self.sh("down", "--dir", str(cdir))
        check(code == 0, f"a second down: exit {code}, want 0", out)

    def status(self, cdir: Path, memnodes: int, mode: str | None) -> str:
        code, out = self.sh("status", "--dir", str(cdir))
        check(code == 0, f"status: exit {code}", out)
        up = [ln for ln in out.splitlines() if re.match(r"memnode \d+ copy \d+ .*\balive$", ln)]
        check(len(up) == memnodes, f"status shows {len(up)} memnodes alive, want {memnodes}", out)
        headers = [ln for ln in out.splitlines() if re.match(r"memnode \d+: region", ln)]
        check(len(headers) >= 1, "status printed no region header", out)
        if mode:
            check(all(f"mode {mode}" in h for h in headers), f"status: headers not of mode {mode}", out)
        return out

    def data(self) -> None:
        b = self.bin_dir
        must([str(b / "datagen"), "--n", "2000", "--d", "16", "--clusters", "8", "--queries", "100",
              "--out-base", "base.fvecs", "--out-queries", "queries.fvecs"], self.tmp)
        must([str(b / "groundtruth"), "--base", "base.fvecs", "--queries", "queries.fvecs", "--k", "10",
              "--out", "gt.ivecs"], self.tmp)
        must([str(b / "workload"), "--queries", "queries.fvecs", "--groundtruth", "gt.ivecs", "--dist",
              "zipf:0.99", "--count", "500", "--warmup", "50", "--out", "zipf.wl"], self.tmp)
        log("data made")

    def shm_cluster(self) -> None:
        c = self.tmp / "c"
        code, out = self.sh("up", "--dir", str(c), "--memnodes", "2", "--region", "192MiB")
        check(code == 0, f"up: exit {code}", out)
        env = read_env(c, self.tmp)
        check(len(env["MEMNODES"].split(",")) == 2, f"cluster.env: MEMNODES={env['MEMNODES']}, want 2 addresses")
        check(env["PROVIDER"] == "shm" and env["TOKEN_FILE"] == "", f"cluster.env: {env}")
        check(env["CLUSTER_DIR"] == str(c.resolve()), f"cluster.env: CLUSTER_DIR={env['CLUSTER_DIR']}")
        pids = self.live_pids(c, {"memnode": 2})

        for sub in (["build", "--data", "base.fvecs", "--m", "8", "--ef-construction", "40"],
                    ["query", "--workload", "zipf.wl", "--ef-search", "32"]):
            must(["bash", "-c", 'source "$1/cluster.env" && exec "$2/computenode" --mode shine --provider "$PROVIDER" '
                  '--memnodes "$MEMNODES" "${@:3}"', "cn", str(c), str(self.bin_dir), *sub], self.tmp, 150)
            log(f"computenode {sub[0]} through cluster.env: exit 0")
        self.status(c, 2, "shine")

        code, out = self.sh("serve", "shine", "--dir", str(c))
        check(code == 0, f"serve shine: exit {code}", out + self.tail(c / "serve.log"))
        addr = (c / "serve.addr").read_text().strip() if (c / "serve.addr").exists() else ""
        env = read_env(c, self.tmp)
        check(addr != "" and env["SERVE"] == addr, f"serve.addr {addr!r}, SERVE={env['SERVE']!r}")
        pids = self.live_pids(c, {"memnode": 2, "serve shine": 1})
        host, port = addr.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        log(f"serve answers on {addr}")
        self.status(c, 2, "shine")

        code, out = self.sh("up", "--dir", str(c), "--memnodes", "2", "--region", "192MiB")
        check(code != 0 and "already" in out, f"a second up on a running cluster: exit {code}, want refused", out)
        check(pids_of(c) == pids, "the refused up changed cluster.pids")
        self.check_down(c, pids)

    def replica_cluster(self) -> None:
        r = self.tmp / "r"
        r.mkdir()
        dead = subprocess.Popen(["true"])  # a pid that no longer runs: a stale cluster.pids
        dead.wait()
        (r / "cluster.pids").write_text(f"memnode 0 0 {dead.pid} 127.0.0.1:1\n")
        code, out = self.sh("up", "--dir", str(r), "--memnodes", "1", "--replicas", "2", "--provider", "tcp")
        check(code == 0, f"up with replicas over tcp: exit {code}", out)
        check("stale" in out, "up did not note the stale cluster.pids", out)
        env = read_env(r, self.tmp)
        check(len(env["MEMNODES"].split(",")) == 2, f"cluster.env: MEMNODES={env['MEMNODES']}, want 2 copies")
        token = Path(env["TOKEN_FILE"])
        check(token.is_file(), f"cluster.env: TOKEN_FILE={env['TOKEN_FILE']} is no file")
        check(token.stat().st_mode & 0o777 == 0o600, f"{token}: mode {oct(token.stat().st_mode & 0o777)}, want 0600")
        secret = token.read_text().strip().encode()
        check(len(secret) >= 40, f"{token}: {len(secret)} characters, want a base64 of 32 bytes")
        leaks = [pid for pid, cmd in cmdlines().items() if secret in cmd]
        check(not leaks, f"the token is on the command line of pids {leaks}")
        pids = self.live_pids(r, {"memnode 0 0": 1, "memnode 0 1": 1})
        self.status(r, 2, None)
        self.check_down(r, pids)

    @staticmethod
    def tail(path: Path) -> str:
        return "\n".join(path.read_text(errors="replace").splitlines()[-20:]) if path.exists() else ""

    def cleanup(self) -> None:
        for d in ("c", "r"):
            if (self.tmp / d / "cluster.pids").exists():
                try:
                    self.sh("down", "--dir", str(self.tmp / d), timeout=60)
                except Exception as e:  # noqa: BLE001 - the kills below still run
                    log(f"down in cleanup: {e}")
        mark = str(self.tmp).encode()
        for pid, cmd in cmdlines().items():
            if pid != os.getpid() and (mark in cmd or pid in self.seen) and alive(pid):
                if pid in self.seen and b"memnode" not in cmd and b"computenode" not in cmd:
                    continue  # a reused pid
                shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:120]
                log(f"killing leftover pid {pid}: {shown}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
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
    tmp = Path(tempfile.mkdtemp(prefix="dmhnsw-cluster-sh-"))
    t = Test(bin_dir, repo, tmp)
    ok = False
    try:
        log(f"scratch {tmp}")
        t.data()
        t.shm_cluster()
        t.replica_cluster()
        ok = True
    except TestFailure as e:
        print(f"FAIL: {e}", flush=True)
    except Exception as e:  # noqa: BLE001 - an error of the test itself still fails cleanly
        print(f"FAIL: {type(e).__name__}: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        t.cleanup()
        if not ok:
            for log_file in sorted(tmp.glob("*/*.log")):
                print(f"----- {log_file.relative_to(tmp)} (last 20 lines) -----\n{Test.tail(log_file)}")
        shutil.rmtree(tmp, ignore_errors=True)
    log("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
