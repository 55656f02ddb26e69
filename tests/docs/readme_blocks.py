#!/usr/bin/env python3
"""Runs the commands of README.md as a user would type them, so that none of them can rot.

Every ```sh block of the README (and every ```python block that is meant to run) is preceded by
a tag saying what runs it:

    <!-- run: one-host -->                  a section of commands run in order on one host
    <!-- run: one-host python -->           the block belongs to both tags
    <!-- run: several-hosts host=mn0 -->    run on host mn0 (a network namespace in the test)
    <!-- run: several-hosts -->             several-hosts without host=: run on every host
    <!-- run: python with=.venv/bin/python --> (a ```python block) run with that interpreter
    <!-- run: ci -->                        run by CI (.ci/run runs tools/test.sh), not here

Usage:

    readme_blocks.py --check [--readme README.md]
        Fails, naming the line, when a sh block has no tag, a tag is unknown or malformed, a tag
        comment is followed by no block, or a tag's commands do not parse (bash -n, compile()).
    readme_blocks.py --list
        Every tagged block with its line.
    readme_blocks.py --run TAG --bin BIN_DIR [--set VAR=VALUE ...] [--timeout S] [--isolate] [--keep]
        Concatenates TAG's blocks in README order and runs them with bash (set -euo pipefail) in a
        fresh temporary directory laid out like the repository root: build/bin is a symbolic link
        to BIN_DIR, python/ and proto/ are copies (pip builds inside python/), and so are
        tools/cluster.sh and the tools/pids.sh it sources. --set VAR=VALUE
        replaces the README's assignment `VAR=...` (a line of its own) in TAG's blocks; a VAR that
        TAG's blocks never assign is an error. The script runs in a process group of its own,
        which is killed at the end whatever happened (SIGTERM, then SIGKILL), so background
        memnodes never outlive the run. A failing command is named by its README line. With
        --isolate (root only) it runs in a fresh network namespace with only loopback, so fixed
        ports cannot collide with anything else on the host.
        Tag several-hosts: every host=X names a host; the runner (root only; otherwise it prints
        why and exits 77) makes a network namespace per host, joined by veth pairs to a bridge in
        one more namespace, the hosts numbered in order of appearance with 10.99.0.1, .2, ...;
        each host gets one bash that lives until the end (its background processes too), and
        each block runs in its host's bash (blocks without host= in every host's). In --set
        values, {X} stands for host X's address, e.g. --set 'MN0={mn0}:7000'. The hosts share
        the temporary directory (a real cluster copies what they share, as the README says).
        The namespaces are deleted at the end.
    readme_blocks.py --extract TAG --bin BIN_DIR --out FILE [--set ...]
        Writes the script --run would run, standalone: `bash FILE WORKDIR` lays out WORKDIR
        (build/bin, python/, proto/) and runs the blocks there. The soft-RoCE test runs the rdma
        tag's blocks this way inside a QEMU guest (tests/rxe/guest.sh case readme).

Exit status: 0 passed; 1 failed; 2 usage error; 77 skipped (several-hosts without root).
Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.dont_write_bytecode = True

REPO = Path(__file__).resolve().parent.parent.parent
TAGS = {
    "one-host": "run by --run one-host (ctest docs_readme_one_host)",
    "several-hosts": "run by --run several-hosts, one network namespace per host= (ctest docs_readme_several_hosts)",
    "rdma": "run in a soft-RoCE QEMU guest (ctest test_rxe: the README's RDMA commands; tests/rxe/guest.sh readme)",
    "python": "run by --run python (ctest docs_readme_python)",
    "ci": "run by CI and ctest, not by this script: .ci/run runs tools/test.sh; ctest docs_demo runs tools/demo.sh",
}
NOT_RUN_HERE = {"ci"}
SH_LANGS = {"sh", "bash", "shell"}
RUN_LANGS = SH_LANGS | {"python"}
COPIED = ("python", "proto")  # copied into the work directory (pip builds inside python/)
SKIP = 77
NET = "10.99.0"  # several-hosts: host i has NET.(i+1)/24

TAG_RE = re.compile(r"^\s*<!--\s*run:\s*(.*?)\s*-->\s*$")
FENCE_RE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass
class Block:
    line: int  # README line of the opening fence (1-based)
    lang: str
    text: list[str]  # the lines inside the fence
    tags: list[str] = field(default_factory=list)
    host: str | None = None
    interp: str | None = None
    tag_line: int | None = None

    @property
    def first(self) -> int:
        """README line of the block's first command line."""
        return self.line + 1


class ReadmeError(Exception):
    pass


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of the README and the problems --check reports (file:line: what)."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # a tag comment waiting for its block
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = TAG_RE.match(ln)
        if m:
            if pending:
                problems.append(f"{path}:{pending[0]}: tag `{pending[1]}` is followed by no code block")
            pending = (i + 1, m.group(1))
            i += 1
            continue
        f = FENCE_RE.match(ln)
        if f:
            indent, fence, lang = f.group(1), f.group(2), f.group(3).lower()
            start = i
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            if i >= len(lines):
                problems.append(f"{path}:{start + 1}: code block not closed")
            b = Block(line=start + 1, lang=lang, text=body)
            if pending:
                b.tag_line = pending[0]
                problems += apply_tag(path, b, pending[1])
                pending = None
            elif lang in SH_LANGS:
                problems.append(f"{path}:{start + 1}: ```{lang} block without a `<!-- run: TAG -->` line before it "
                                f"(tags: {', '.join(TAGS)})")
            blocks.append(b)
            i += 1
            continue
        if pending and ln.strip():
            problems.append(f"{path}:{pending[0]}: tag `{pending[1]}` is not right before a code block")
            pending = None
        i += 1
    if pending:
        problems.append(f"{path}:{pending[0]}: tag `{pending[1]}` is followed by no code block")
    return blocks, problems


def apply_tag(path: Path, b: Block, spec: str) -> list[str]:
    where = f"{path}:{b.tag_line}"
    out = []
    for word in spec.split():
        if "=" in word:
            k, v = word.split("=", 1)
            if k == "host" and re.fullmatch(r"[a-z][a-z0-9]{0,7}", v):
                b.host = v
            elif k == "with" and v:
                b.interp = v
            else:
                out.append(f"{where}: bad option `{word}` (host=NAME with 1-8 lowercase letters/digits, with=PATH)")
        elif word in TAGS:
            b.tags.append(word)
        else:
            out.append(f"{where}: unknown tag `{word}` (known: {', '.join(TAGS)})")
    if not b.tags and not out:
        out.append(f"{where}: no tag in `{spec}`")
    if b.lang not in RUN_LANGS:
        out.append(f"{where}: a tag before a ```{b.lang or '(no language)'} block; only sh and python blocks run")
    if b.host and "several-hosts" not in b.tags:
        out.append(f"{where}: host= only goes with the several-hosts tag")
    if b.interp and b.lang != "python":
        out.append(f"{where}: with= only goes with a ```python block")
    if b.lang == "python" and "several-hosts" in b.tags:
        out.append(f"{where}: python blocks are not supported under several-hosts")
    return out


def blocks_of(blocks: list[Block], tag: str) -> list[Block]:
    return [b for b in blocks if tag in b.tags]


# ------------------------------------------------------------------------------------ scripts

def parse_sets(sets: list[str]) -> dict[str, str]:
    out = {}
    for s in sets:
        if "=" not in s or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s.split("=", 1)[0]):
            raise ReadmeError(f"--set {s}: want VAR=VALUE")
        k, v = s.split("=", 1)
        out[k] = v
    return out


def substitute(blocks: list[Block], tag: str, sets: dict[str, str]) -> dict[int, list[str]]:
    """Each block's lines with the --set assignments replaced (same number of lines)."""
    seen = set()
    out = {}
    for b in blocks:
        lines = list(b.text)
        if b.lang in SH_LANGS:
            for n, ln in enumerate(lines):
                m = re.match(r"^(\s*)(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=", ln)
                if m and m.group(2) in sets:
                    var = m.group(2)
                    seen.add(var)
                    lines[n] = f"{m.group(1)}{var}={shlex.quote(sets[var])}  # readme_blocks --set (README: {ln.strip()})"
        out[b.line] = lines
    missing = set(sets) - seen
    if missing:
        raise ReadmeError(f"--set {', '.join(sorted(missing))}: no line of tag {tag}'s blocks assigns "
                          f"{'it' if len(missing) == 1 else 'them'} (want a line `VAR=...`)")
    return out


TRAP = ("trap '__rb_rc=$?; echo \"readme_blocks: README.md:$((LINENO + __rb_off)) failed (exit $__rb_rc): "
        "$BASH_COMMAND\" >&2' ERR")


def block_header(b: Block, tag: str, host: str | None = None) -> str:
    where = f" on {host}" if host else ""
    return f"echo '>>> README.md:{b.line} ({tag}{where})' >&2"


def python_lines(b: Block, lines: list[str]) -> list[str]:
    """A ```python block written to a file and run by its interpreter (with= or python3); blank
    lines in front of the code make a traceback's line numbers README lines."""
    interp = b.interp or "python3"
    path = f".readme-python-line{b.first}.py"
    pad = [""] * (b.first - 1)
    return [f"cat > {path} <<'__README_PYTHON__'", *pad, *lines, "__README_PYTHON__", f"{interp} {path}"]


def preamble(bin_dir: Path, repo: Path, tag: str, readme: Path) -> list[str]:
    copies = " ".join(shlex.quote(str(repo / c)) for c in COPIED)
    return [
        "#!/usr/bin/env bash",
        f"# Generated by tests/docs/readme_blocks.py from {readme}, tag {tag}: `bash THIS WORKDIR`.",
        "set -euo pipefail",
        "__rb_off=0",
        TRAP,
        'cd "${1:?usage: bash THIS WORKDIR}"',
        "mkdir -p build",
        f"ln -sfn {shlex.quote(str(bin_dir))} build/bin",
        f"for __rb_src in {copies}; do rm -rf \"./${{__rb_src##*/}}\"; cp -r \"$__rb_src\" .; done",
        "rm -rf python/build python/*.egg-info; find python -name '*_pb2*.py*' -o -name __pycache__ | xargs rm -rf",
        f"mkdir -p tools && cp {shlex.quote(str(repo / 'tools' / 'cluster.sh'))} "
        f"{shlex.quote(str(repo / 'tools' / 'pids.sh'))} tools/",
    ]


def script_for(blocks: list[Block], tag: str, bin_dir: Path, repo: Path, readme: Path, sets: dict[str, str]) -> str:
    """The single bash script of a tag (not several-hosts): its blocks in README order."""
    chosen = blocks_of(blocks, tag)
    texts = substitute(chosen, tag, sets)
    out = preamble(bin_dir, repo, tag, readme)
    for b in chosen:
        out.append(block_header(b, tag))
        if b.lang == "python":
            # a failing interpreter is named by the block's first line (its traceback names the line)
            body = python_lines(b, texts[b.line])
            out.append(f"__rb_off={b.first - (len(out) + 1 + len(body))}")
            out += body
        else:
            # LINENO + __rb_off is the README line of the command that failed
            out.append(f"__rb_off={b.first - (len(out) + 2)}")
            out += texts[b.line]
    out.append("echo '>>> README.md: every block of tag " + tag + " ran' >&2")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------- processes

def kill_group(pgid: int, grace: float = 10.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM to a process group, SIGKILL to what is left after `grace` seconds. `leader`, the
    group's first process when it is our child, is reaped meanwhile (a zombie still counts)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if leader is not None:
            leader.poll()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    left = subprocess.run(["ps", "-o", "pid=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    print(f"readme_blocks: still running {grace:.0f} s after SIGTERM, killed: {left.strip()}", flush=True)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Stopped(Exception):
    pass


def on_signal(signum, _frame):
    raise Stopped(f"signal {signum}")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ReadmeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def can_make_netns() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    if not shutil.which("ip"):
        return "no `ip` (iproute2)"
    return None


class Netns:
    """Network namespaces PREFIX-HOST (and PREFIX-sw with the bridge); deleted by close()."""

    def __init__(self, hosts: list[str]) -> None:
        self.prefix = f"rb{os.getpid()}"
        self.hosts = hosts
        self.made: list[str] = []
        self.addr = {h: f"{NET}.{i + 1}" for i, h in enumerate(hosts)}

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def up(self) -> None:
        sw = f"{self.prefix}-sw"
        for name in [sw] + [self.ns(h) for h in self.hosts]:
            sh("ip", "netns", "add", name)
            self.made.append(name)
            sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            port = f"p{i}"
            sh("ip", "link", "add", "eth0", "netns", self.ns(h), "type", "veth", "peer", "name", port, "netns", sw)
            sh("ip", "-n", sw, "link", "set", port, "master", "br0")
            sh("ip", "-n", sw, "link", "set", port, "up")
            sh("ip", "-n", self.ns(h), "addr", "add", f"{self.addr[h]}/24", "dev", "eth0")
            sh("ip", "-n", self.ns(h), "link", "set", "eth0", "up")

    def close(self) -> None:
        for name in reversed(self.made):
            # anything still running inside (ours: nobody else knows these namespaces)
            pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            for _ in range(50):
                if sh("ip", "netns", "del", name, check=False).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                print(f"readme_blocks: could not delete network namespace {name}", flush=True)
        self.made.clear()


def prepare_workdir(work: Path, bin_dir: Path, repo: Path) -> None:
    (work / "build").mkdir(parents=True, exist_ok=True)
    (work / "build" / "bin").symlink_to(bin_dir)
    for c in COPIED:
        shutil.copytree(repo / c, work / c, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                                          ".venv", "*_pb2*.py*"))


def run_single(args, blocks: list[Block], readme: Path) -> int:
    bin_dir = Path(args.bin).resolve()
    sets = parse_sets(args.set)
    script = script_for(blocks, args.run, bin_dir, REPO, readme, sets)
    work = Path(tempfile.mkdtemp(prefix=f"readme-{args.run}-"))
    (work / ".readme-script.sh").write_text(script)
    argv = ["bash", str(work / ".readme-script.sh"), str(work)]
    netns = None
    if args.isolate:
        why = can_make_netns()
        if why:
            print(f"readme_blocks: --isolate: {why}; running in this host's network namespace", flush=True)
        else:
            netns = f"rb{os.getpid()}-iso"
            sh("ip", "netns", "add", netns)
            sh("ip", "-n", netns, "link", "set", "lo", "up")
            argv = ["ip", "netns", "exec", netns] + argv
    print(f"readme_blocks: tag {args.run}: {len(blocks_of(blocks, args.run))} block(s) of {readme} in {work}"
          f"{' (network namespace ' + netns + ')' if netns else ''}", flush=True)
    p = None
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"readme_blocks: FAIL: tag {args.run} still running after {args.timeout} s", flush=True)
            code = -1
    except Stopped as e:
        print(f"readme_blocks: stopped by {e}", flush=True)
        code = -1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if p is not None:
            kill_group(p.pid, leader=p)  # every background process the README's commands started
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if netns:
            for pid in sh("ip", "netns", "pids", netns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", netns, check=False)
        if args.keep:
            print(f"readme_blocks: kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    dt = time.monotonic() - t0
    if code == 0:
        print(f"readme_blocks: PASS: tag {args.run} in {dt:.1f} s", flush=True)
        return 0
    if code > 0:
        print(f"readme_blocks: FAIL: tag {args.run}: exit {code} after {dt:.1f} s (the failing README line is above)",
              flush=True)
    return 1


class HostShell:
    """One bash per host in its namespace; blocks are sourced into it one at a time."""

    def __init__(self, host: str, argv: list[str], work: Path) -> None:
        self.host = host
        self.p = subprocess.Popen(argv, cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True, text=True, bufsize=1)
        self.done = threading.Event()
        self.marker = ""
        self.seen = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.send(f"set -euo pipefail\n__rb_off=0\n{TRAP}\ncd {shlex.quote(str(work))}\n")

    def _read(self) -> None:
        for line in self.p.stdout:
            if self.marker and line.strip() == self.marker:
                self.seen = True
                self.done.set()
                continue
            print(f"[{self.host}] {line}", end="", flush=True)
        self.done.set()  # EOF: the shell exited

    def send(self, text: str) -> None:
        self.p.stdin.write(text)
        self.p.stdin.flush()

    def run_block(self, n: int, path: Path, off: int, timeout: float) -> None:
        self.done.clear()
        self.seen = False
        self.marker = f"__readme_block_{n}_done__"
        try:
            self.send(f"__rb_off={off}\nsource {shlex.quote(str(path))} </dev/null\necho {self.marker}\n")
        except (BrokenPipeError, OSError):
            raise ReadmeError(f"its shell is gone ({self.p.poll()})") from None
        if not self.done.wait(timeout):
            raise ReadmeError(f"the block did not finish in {timeout:.0f} s")
        if not self.seen:
            try:
                code = self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise ReadmeError(f"a command failed, its shell exited ({code}; the failing README line is above)")

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        kill_group(self.p.pid, leader=self.p)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def run_hosts(args, blocks: list[Block], readme: Path) -> int:
    chosen = blocks_of(blocks, args.run)
    hosts: list[str] = []
    for b in chosen:
        if b.host and b.host not in hosts:
            hosts.append(b.host)
    if not hosts:
        raise ReadmeError(f"tag {args.run}: no block names a host=")
    why = can_make_netns()
    if why:
        print(f"SKIPPED: tag {args.run} needs a network namespace per host: {why}", flush=True)
        return SKIP
    net = Netns(hosts)
    sets = {k: re.sub(r"\{(\w+)\}", lambda m: net.addr.get(m.group(1), m.group(0)), v)
            for k, v in parse_sets(args.set).items()}
    texts = substitute(chosen, args.run, sets)
    bin_dir = Path(args.bin).resolve()
    work = Path(tempfile.mkdtemp(prefix=f"readme-{args.run}-"))
    shells: dict[str, HostShell] = {}
    t0 = time.monotonic()
    ok = False
    try:
        prepare_workdir(work, bin_dir, REPO)
        (work / ".readme").mkdir()
        net.up()
        print(f"readme_blocks: tag {args.run}: {len(chosen)} block(s) of {readme} on "
              + ", ".join(f"{h} ({net.addr[h]}, netns {net.ns(h)})" for h in hosts) + f"; work directory {work}",
              flush=True)
        for h in hosts:
            shells[h] = HostShell(h, ["ip", "netns", "exec", net.ns(h), "bash", "--noprofile", "--norc", "-s"], work)
        for n, b in enumerate(chosen):
            path = work / ".readme" / f"block-{b.line}.sh"
            path.write_text("\n".join(texts[b.line]) + "\n")
            for h in [b.host] if b.host else hosts:
                print(f">>> README.md:{b.line} ({args.run} on {h}) at {time.monotonic() - t0:.1f} s", flush=True)
                left = args.timeout - (time.monotonic() - t0)
                if left <= 0:
                    raise ReadmeError(f"the run took longer than {args.timeout} s")
                try:
                    shells[h].run_block(n, path, b.first - 1, left)
                except ReadmeError as e:
                    raise ReadmeError(f"README.md:{b.line} on {h}: {e}") from None
        ok = True
    except (ReadmeError, Stopped) as e:
        print(f"readme_blocks: FAIL: {e}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        t1 = time.monotonic()
        for s in shells.values():
            s.close()
        net.close()
        print(f"readme_blocks: every process stopped and the namespaces deleted in {time.monotonic() - t1:.1f} s",
              flush=True)
        if args.keep:
            print(f"readme_blocks: kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    dt = time.monotonic() - t0
    print(f"readme_blocks: {'PASS' if ok else 'FAIL'}: tag {args.run} in {dt:.1f} s", flush=True)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------ check

def check(blocks: list[Block], problems: list[str], readme: Path) -> int:
    for tag in TAGS:
        if not blocks_of(blocks, tag):
            problems.append(f"{readme}: no block is tagged {tag}")
    for tag in TAGS:
        if tag in NOT_RUN_HERE or not blocks_of(blocks, tag):
            continue
        for b in blocks_of(blocks, tag):
            if b.lang == "python":
                try:
                    compile("\n" * (b.first - 1) + "\n".join(b.text) + "\n", str(readme), "exec")
                except SyntaxError as e:
                    problems.append(f"{readme}:{e.lineno}: python block of tag {tag}: {e.msg}")
        if tag == "several-hosts":
            for b in blocks_of(blocks, tag):
                r = subprocess.run(["bash", "-n"], input="\n".join(b.text) + "\n", capture_output=True, text=True)
                if r.returncode != 0:
                    problems.append(f"{readme}:{b.line}: block of tag {tag} does not parse: {r.stderr.strip()}")
            continue
        script = script_for(blocks, tag, Path("/nonexistent/bin"), REPO, readme, {})
        r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"{readme}: the commands of tag {tag} do not parse (bash -n): {r.stderr.strip()}")
    for p in problems:
        print(p)
    n = sum(1 for b in blocks if b.tags)
    if problems:
        print(f"readme_blocks: FAIL: {len(problems)} problem(s) in {readme}")
        return 1
    print(f"readme_blocks: {readme}: {n} tagged block(s), every sh block tagged: "
          + ", ".join(f"{t} {len(blocks_of(blocks, t))}" for t in TAGS))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--readme", default=str(REPO / "README.md"))
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--list", action="store_true")
    mode.add_argument("--run", metavar="TAG")
    mode.add_argument("--extract", metavar="TAG")
    ap.add_argument("--bin", help="the binaries (build/bin)")
    ap.add_argument("--set", action="append", default=[], metavar="VAR=VALUE")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--isolate", action="store_true", help="run in a fresh network namespace (root)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", help="--extract: the script file")
    args = ap.parse_args()
    readme = Path(args.readme).resolve()
    blocks, problems = parse(readme)
    if args.check:
        return check(blocks, problems, readme)
    if args.list:
        for b in blocks:
            if b.tags:
                extra = (f" host={b.host}" if b.host else "") + (f" with={b.interp}" if b.interp else "")
                print(f"README.md:{b.line}: {' '.join(b.tags)}{extra} ({b.lang}, {len(b.text)} lines)")
        return 0
    tag = args.run or args.extract
    if problems:
        for p in problems:
            print(p)
        print("readme_blocks: the README does not pass --check")
        return 1
    if tag not in TAGS:
        print(f"readme_blocks: unknown tag {tag} (known: {', '.join(TAGS)})")
        return 2
    if tag in NOT_RUN_HERE:
        print(f"readme_blocks: tag {tag} is {TAGS[tag]}")
        return 2
    if not args.bin:
        print("readme_blocks: --bin BIN_DIR is needed")
        return 2
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.extract:
            if not args.out:
                print("readme_blocks: --extract needs --out FILE")
                return 2
            if any(b.host for b in blocks_of(blocks, tag)):
                print(f"readme_blocks: tag {tag} has host= blocks: only --run runs it")
                return 2
            Path(args.out).write_text(script_for(blocks, tag, Path(args.bin).resolve(), REPO, readme,
                                                 parse_sets(args.set)))
            print(f"readme_blocks: tag {tag}: {len(blocks_of(blocks, tag))} block(s) into {args.out} "
                  f"(run: bash {args.out} WORKDIR)")
            return 0
        if any(b.host for b in blocks_of(blocks, tag)):
            return run_hosts(args, blocks, readme)
        return run_single(args, blocks, readme)
    except ReadmeError as e:
        print(f"readme_blocks: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
