#!/usr/bin/env python3
"""Checks that every field of the binaries' JSON reports is documented in docs/reports.md.

    report_fields.py [--docs docs/reports.md] FILE[=SECTION] ...
    report_fields.py --bin build/bin [--docs docs/reports.md] [--workdir DIR]

Each report is flattened into dotted paths: object keys joined with '.', an array as
'name[]' and its elements' fields as 'name[].field' (an array of arrays: 'name[][]'); an
empty object or a null is a path of its own. Every path must be listed in the page, in the
section of that kind of report.

The page's convention:
  - a section starts at a comment line `<!-- report: ID -->`, optionally
    `<!-- report: ID; embeds OTHER; embeds OTHER2 at PREFIX -->`: the section also holds
    OTHER's paths (at the top) and OTHER2's paths below PREFIX (e.g. `per_cn[]`);
  - it ends at the next such comment or the next `## ` heading;
  - a field is a table row whose first cell is one path in backticks: | `runs[].qps` | ...;
  - `*` in a path stands for any one key (keys that are data, e.g. status codes).

Which section a report belongs to is told from its own fields (`classify`), or given as
FILE=SECTION.

With --bin DIR the reports are made first, in a scratch directory, by the binaries in DIR over
`--provider shm` on 127.0.0.1 only: 2 memnodes; a shine index built by 2 computenodes,
inserted into, queried by 1 and by 2 computenodes (node caches, adaptive routing, traces),
csp-report, shine-route-sim, fabric-bench, `computenode serve` with serve-bench (closed and
open loop), hnswlib-bench, faiss-bench; then 2 fresh memnodes with a d-HNSW index built online, queried by 2
and by 1 computenodes, inserted into, upserted into and deleted from by id, queried with --mix,
rebuilt; dhnsw-build; and
shine-import into a fresh memnode, upserted into and deleted from by id. Every process it starts is stopped (SIGTERM, then SIGKILL)
whatever happens. Exit 0: every path documented; 1: undocumented paths (listed) or a report
that could not be made or read; 2: usage.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[2]

MARK = re.compile(r"^\s*<!--\s*report:\s*(.*?)\s*-->\s*$")
EMBED = re.compile(r"^embeds\s+([A-Za-z0-9_-]+)(?:\s+at\s+(\S+))?$")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")
PATH_SYNTAX = re.compile(r"^[A-Za-z0-9_*]+(\[\])*(\.[A-Za-z0-9_*]+(\[\])*)*$")


class Section:
    def __init__(self, sid: str, line: int):
        self.id = sid
        self.line = line
        self.paths: list[str] = []
        self.patterns: list[re.Pattern] = []
        self.embeds: list[tuple[str, str]] = []  # (section id, prefix; "" = top)


def parse_docs(path: Path) -> dict[str, Section]:
    sections: dict[str, Section] = {}
    errors: list[str] = []
    cur: Section | None = None
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = MARK.match(line)
        if m:
            parts = [p.strip() for p in m.group(1).split(";")]
            sid = parts[0]
            if not re.fullmatch(r"[A-Za-z0-9_-]+", sid):
                errors.append(f"{path}:{no}: bad section id '{sid}'")
                cur = None
                continue
            if sid in sections:
                errors.append(f"{path}:{no}: section '{sid}' again (first at line {sections[sid].line})")
            cur = Section(sid, no)
            sections[sid] = cur
            for p in parts[1:]:
                e = EMBED.match(p)
                if not e:
                    errors.append(f"{path}:{no}: cannot read '{p}' (want 'embeds ID' or 'embeds ID at PREFIX')")
                    continue
                cur.embeds.append((e.group(1), e.group(2) or ""))
            continue
        if line.startswith("## ") or line.startswith("# "):
            cur = None
            continue
        r = ROW.match(line)
        if r and cur is not None:
            p = r.group(1)
            if not PATH_SYNTAX.match(p):
                errors.append(f"{path}:{no}: '{p}' is not a field path (a.b[].c, * for any key)")
                continue
            cur.paths.append(p)
            rx = re.escape(p).replace(r"\*", r"[^.\[\]]+")
            cur.patterns.append(re.compile(rx))
    for s in sections.values():
        for other, _ in s.embeds:
            if other not in sections:
                errors.append(f"{path}:{s.line}: section '{s.id}' embeds '{other}', which the page does not have")
    if errors:
        raise SystemExit("docs page:\n  " + "\n  ".join(errors))
    return sections


def flatten(value, prefix: str, out: set[str]) -> None:
    if isinstance(value, dict):
        if not value and prefix:
            out.add(prefix)
        for k, v in value.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        here = prefix + "[]"
        out.add(here)
        for v in value:
            if isinstance(v, (dict, list)):
                flatten(v, here, out)
    else:
        out.add(prefix)


def documented(path: str, sid: str, sections: dict[str, Section], depth: int = 0) -> bool:
    if depth > 16:
        return False  # an embedding cycle
    s = sections[sid]
    if any(rx.fullmatch(path) for rx in s.patterns):
        return True
    for other, prefix in s.embeds:
        if not prefix:
            if documented(path, other, sections, depth + 1):
                return True
        elif path.startswith(prefix + "."):
            if documented(path[len(prefix) + 1:], other, sections, depth + 1):
                return True
    return False


def classify(r: dict) -> str | None:
    tool, mode, kind = r.get("tool"), r.get("mode"), r.get("kind")
    by_tool = {
        "dhnsw-build": "dhnsw-build-tool",
        "computenode dhnsw build": "dhnsw-build",
        "computenode dhnsw insert": "dhnsw-insert",
        "computenode dhnsw delete": "dhnsw-delete",
        "computenode dhnsw rebuild": "dhnsw-rebuild-file",
        "serve-bench": "serve-bench",
        "computenode rejoin": "rejoin",
        "faiss-bench": "faiss-bench",
    }
    if tool in by_tool:
        return by_tool[tool]
    if mode == "shine" and kind in ("insert", "upsert"):
        return "shine-build"  # one section for build, insert and upsert
    if mode == "shine" and kind in ("build", "query", "import", "delete", "consolidate"):
        return "shine-" + kind
    if mode == "dhnsw" and kind in ("query", "mixed"):
        return "dhnsw-" + kind
    if r.get("system") == "hnswlib":
        return "hnswlib-bench"
    if "read_latency" in r or "read_throughput" in r:
        return "fabric-bench"
    if "routings" in r:
        return "shine-route-sim"
    if "x" in r and "runs" in r:
        return "csp-report"
    return None


def check(files: list[str], sections: dict[str, Section], verbose: bool) -> int:
    bad = 0
    seen_by_section: dict[str, set[str]] = {}
    for spec in files:
        path, _, forced = spec.partition("=")
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"FAIL {path}: cannot read a JSON report: {e}")
            bad += 1
            continue
        if not isinstance(report, dict):
            print(f"FAIL {path}: the report is not a JSON object")
            bad += 1
            continue
        sid = forced or classify(report)
        if sid is None:
            print(f"FAIL {path}: cannot tell which report this is (give FILE=SECTION)")
            bad += 1
            continue
        if sid not in sections:
            print(f"FAIL {path}: the page has no section '{sid}'")
            bad += 1
            continue
        paths: set[str] = set()
        flatten(report, "", paths)
        seen_by_section.setdefault(sid, set()).update(paths)
        missing = sorted(p for p in paths if not documented(p, sid, sections))
        if missing:
            bad += 1
            print(f"FAIL {path} (section '{sid}'): {len(missing)} field(s) not in the page:")
            for p in missing:
                print(f"       {p}")
        else:
            print(f"ok   {path} (section '{sid}'): {len(paths)} paths documented")
    if verbose:
        for sid, paths in sorted(seen_by_section.items()):
            unseen = [p for p in sections[sid].paths if "*" not in p and p not in paths]
            if unseen:
                print(f"note: section '{sid}' lists paths these reports did not have: {', '.join(unseen)}")
    return bad


# ------------------------------------------------------------------------------- making reports

class Runner:
    """Starts the binaries in a scratch directory; stops every process it started."""

    def __init__(self, bin_dir: Path, work: Path):
        self.bin = bin_dir
        self.work = work
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = dict(os.environ)
        self.env.pop("DMHNSW_TOKEN", None)
        self.env["DMHNSW_PROGRESS"] = "0"
        self.env.setdefault("OMP_NUM_THREADS", "2")
        self.n = 0

    def exe(self, name: str) -> str:
        p = self.bin / name
        if not p.exists():
            raise RuntimeError(f"{p}: no such binary (build first)")
        return str(p)

    def log(self, name: str) -> Path:
        self.n += 1
        return self.work / f"{self.n:02d}-{name}.log"

    @staticmethod
    def tail(path: Path, lines: int = 15) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def run(self, name: str, args: list[str], timeout: float = 60) -> None:
        t0 = time.monotonic()
        p, log = self.start(name, args)
        self.wait(name, p, log, timeout)
        print(f"  {name}: {time.monotonic() - t0:.1f} s", flush=True)

    def start(self, name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.log(name)
        f = open(log, "wb")
        try:
            p = subprocess.Popen([self.exe(args[0])] + args[1:], cwd=self.work, env=self.env, stdout=f,
                                 stderr=subprocess.STDOUT)
        finally:
            f.close()
        self.procs.append((name, p))
        with open(self.work / "pids.txt", "a") as f:  # which process was which, for a post-mortem
            f.write(f"{p.pid} {name}\n")
        return p, log

    def wait(self, name: str, p: subprocess.Popen, log: Path, timeout: float = 60) -> None:
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop([p])
            raise RuntimeError(f"{name}: no exit within {timeout:.0f} s; its log {log}:\n{self.tail(log)}")
        if rc != 0:
            raise RuntimeError(f"{name}: exit code {rc}; its log {log}:\n{self.tail(log)}")

    def memnodes(self, tag: str, count: int) -> tuple[str, list[subprocess.Popen]]:
        started = []
        for i in range(count):
            ready = self.work / f"{tag}-memnode{i}.addr"
            ready.unlink(missing_ok=True)
            p, log = self.start(f"{tag}-memnode{i}", ["memnode", "--id", str(i), "--provider", "shm", "--listen",
                                                       "127.0.0.1:0", "--region", "128MiB", "--ready-file", str(ready)])
            started.append((p, log, ready))
        addrs = []
        deadline = time.monotonic() + 30
        for p, log, ready in started:
            while not (ready.exists() and ready.read_text().strip()):
                if p.poll() is not None:
                    raise RuntimeError(f"memnode {log.name}: exit code {p.returncode} before serving:\n{self.tail(log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"memnode {log.name}: not serving after 30 s:\n{self.tail(log)}")
                time.sleep(0.05)
            addrs.append(ready.read_text().strip())
        return ",".join(addrs), [p for p, _, _ in started]

    def stop(self, procs: list[subprocess.Popen], grace: float = 8.0) -> None:
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self) -> None:
        self.stop([p for _, p in self.procs])


def wait_for_line(log: Path, pattern: str, p: subprocess.Popen, timeout: float = 30) -> re.Match:
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = rx.search(log.read_text(errors="replace")) if log.exists() else None
        if m:
            return m
        if p.poll() is not None:
            raise RuntimeError(f"{log.name}: exit code {p.returncode}:\n{Runner.tail(log)}")
        time.sleep(0.05)
    raise RuntimeError(f"{log.name}: no line matching {pattern!r} within {timeout:.0f} s:\n{Runner.tail(log)}")


def make_reports(r: Runner) -> list[str]:
    """Runs the binaries; returns the report files they wrote."""
    w = r.work
    print(f"making reports in {w}", flush=True)
    r.run("datagen", ["datagen", "--n", "2000", "--d", "16", "--clusters", "8", "--spread", "0.3", "--seed", "1",
                      "--queries", "60", "--out-base", "base.fvecs", "--out-queries", "q.fvecs"])
    r.run("groundtruth", ["groundtruth", "--base", "base.fvecs", "--queries", "q.fvecs", "--k", "10", "--metric", "l2",
                          "--out", "gt.ivecs"])
    r.run("workload", ["workload", "--queries", "q.fvecs", "--groundtruth", "gt.ivecs", "--dist", "zipf:0.99",
                       "--count", "200", "--warmup", "40", "--seed", "7", "--out", "w.wl"])

    # ---- shine, on 2 memnodes
    mn, pair = r.memnodes("shine", 2)
    cn = ["computenode", "--mode", "shine", "--provider", "shm", "--memnodes", mn]
    build = ["build", "--data", "base.fvecs", "--max-elements", "1500", "--m", "8", "--ef-construction", "40",
             "--threads", "1", "--coroutines", "2", "--report", "shine-build.json"]
    p1, l1 = r.start("shine-build-cn1", cn + ["--num-cns", "2", "--cn-id", "1"] + build)
    r.run("shine-build-cn0", cn + ["--num-cns", "2", "--cn-id", "0"] + build)
    r.wait("shine-build-cn1", p1, l1)
    r.run("shine-insert", cn + ["insert", "--data", "base.fvecs", "--begin", "1500", "--threads", "1",
                                "--coroutines", "2", "--report", "shine-insert.json"])
    r.run("shine-query", cn + ["query", "--workload", "w.wl", "--k", "10", "--ef-search", "16,32", "--threads", "1",
                               "--coroutines", "2", "--report", "shine-query.json"])
    routed = ["query", "--workload", "w.wl", "--k", "10", "--ef-search", "16", "--threads", "1", "--coroutines", "2",
              "--cache-ratio", "0.1", "--routing", "adaptive", "--route-batch", "20", "--trace", "traces",
              "--report", "shine-query-routed.json"]
    p1, l1 = r.start("shine-query-routed-cn1", cn + ["--num-cns", "2", "--cn-id", "1"] + routed)
    r.run("shine-query-routed-cn0", cn + ["--num-cns", "2", "--cn-id", "0"] + routed)
    r.wait("shine-query-routed-cn1", p1, l1)
    r.run("csp-report", ["csp-report", "traces", "--json", "csp-report.json"])
    r.run("shine-route-sim", ["shine-route-sim", "--provider", "shm", "--memnodes", mn, "--workload", "w.wl",
                              "--num-cns", "2", "--ef-search", "16", "--route-batch", "20", "--bound-rounds", "2",
                              "--json", "shine-route-sim.json"])
    r.run("fabric-bench", ["fabric-bench", "--provider", "shm", "--memnodes", mn, "--seconds", "0.02", "--iters", "200",
                           "--max-size", "4KiB", "--json", "fabric-bench.json"])
    serve, slog = r.start("serve", cn + ["serve", "--listen", "127.0.0.1:0", "--grace-seconds", "1"])
    addr = wait_for_line(slog, r"serving shine on (127\.0\.0\.1:\d+)", serve).group(1)
    r.run("serve-bench", ["serve-bench", "--target", addr, "--workload", "w.wl", "--clients", "2", "--batch", "4",
                          "--json", "serve-bench.json"])
    r.run("serve-bench-open", ["serve-bench", "--target", addr, "--workload", "w.wl", "--clients", "2", "--batch", "4",
                               "--rate", "100", "--seconds", "0.5", "--json", "serve-bench-open.json"])
    r.stop([serve])
    r.stop(pair)
    r.run("hnswlib-bench", ["hnswlib-bench", "--base", "base.fvecs", "--workload", "w.wl", "--m", "8",
                            "--ef-construction", "40", "--ef-search", "16", "--threads", "2", "--json",
                            "hnswlib-bench.json", "--save", "hnswlib.bin"])
    # PQ re-ranked: every field (train rows, quantizer and re-rank bytes) is set
    r.run("faiss-bench", ["faiss-bench", "--base", "base.fvecs", "--workload", "w.wl", "--index", "hnsw-pq:4",
                          "--rerank", "0,20", "--m", "8", "--ef-construction", "40", "--ef-search", "16",
                          "--threads", "2", "--json", "faiss-bench.json"])

    # ---- d-HNSW, on 2 fresh memnodes
    mn, pair = r.memnodes("dhnsw", 2)
    cn = ["computenode", "--mode", "dhnsw", "--provider", "shm", "--memnodes", mn]
    r.run("dhnsw-build", cn + ["build", "--data", "base.fvecs", "--max-elements", "1600", "--partitions", "4",
                               "--m", "8", "--ef-construction", "40", "--report", "dhnsw-build.json"])
    r.run("dhnsw-build-skipped", cn + ["--num-cns", "2", "--cn-id", "1", "build", "--data", "base.fvecs",
                                       "--report", "dhnsw-build-skipped.json"])
    r.run("dhnsw-insert", cn + ["insert", "--data", "base.fvecs", "--begin", "1600", "--batch", "100",
                                "--report", "dhnsw-insert.json"])
    # upsert and delete by id (the build's ids are the row numbers; two ids it never held)
    (w / "dids.txt").write_text("".join(f"{i}\n" for i in list(range(0, 120, 2)) + [7_000_000, 2**62]))
    r.run("dhnsw-upsert", cn + ["upsert", "--data", "q.fvecs", "--ids", "dids.txt", "--report", "dhnsw-upsert.json"])
    r.run("dhnsw-delete", cn + ["delete", "--ids", "dids.txt", "--report", "dhnsw-delete.json"])
    r.run("dhnsw-query", cn + ["query", "--workload", "w.wl", "--k", "10", "--ef-search", "16,32", "--batch", "50",
                               "--probe", "2", "--report", "dhnsw-query.json"])
    # A 2-computenode query after 1-computenode runs on the same memnodes (the board keeps one
    # barrier counter per run size).
    query2 = ["query", "--workload", "w.wl", "--k", "10", "--ef-search", "16", "--batch", "50", "--probe", "2",
              "--report", "dhnsw-query2.json"]
    p1, l1 = r.start("dhnsw-query2-cn1", cn + ["--num-cns", "2", "--cn-id", "1"] + query2)
    r.run("dhnsw-query2-cn0", cn + ["--num-cns", "2", "--cn-id", "0"] + query2)
    r.wait("dhnsw-query2-cn1", p1, l1)
    r.run("dhnsw-mixed", cn + ["query", "--workload", "w.wl", "--k", "10", "--ef-search", "16", "--batch", "50",
                               "--probe", "2", "--mix", "insert:0.2", "--insert-data", "base.fvecs",
                               "--insert-begin", "0", "--insert-end", "100", "--insert-id-offset", "100000",
                               "--report", "dhnsw-mixed.json"])
    r.run("dhnsw-rebuild", cn + ["rebuild", "--report", "dhnsw-rebuild.json"])
    r.stop(pair)
    r.run("dhnsw-build-tool", ["dhnsw-build", "--data", "base.fvecs", "--partitions", "4", "--m", "8",
                               "--ef-construction", "40", "--memnodes", "2", "--out", "dhnsw.img", "--json",
                               "dhnsw-build-tool.json"])

    # ---- shine-import (with SQ8 codes), into 1 fresh memnode
    mn, single = r.memnodes("import", 1)
    r.run("shine-import", ["shine-import", "--hnswlib", "hnswlib.bin", "--metric", "l2", "--data", "base.fvecs",
                           "--codes", "sq8", "--provider", "shm", "--memnodes", mn, "--report", "shine-import.json"])
    # the imported index has an id index: upsert and delete by label (two ids it never held)
    (w / "ids.txt").write_text("".join(f"{i}\n" for i in list(range(0, 200, 2)) + [7_000_000, 2**62]))
    r.run("shine-upsert", ["computenode", "--mode", "shine", "--provider", "shm", "--memnodes", mn, "upsert", "--data",
                           "q.fvecs", "--ids", "ids.txt", "--threads", "1", "--report", "shine-upsert.json"])
    r.run("shine-delete", ["computenode", "--mode", "shine", "--provider", "shm", "--memnodes", mn, "delete", "--ids",
                           "ids.txt", "--threads", "1", "--report", "shine-delete.json"])
    r.run("shine-consolidate", ["computenode", "--mode", "shine", "--provider", "shm", "--memnodes", mn, "consolidate",
                                "--threads", "1", "--report", "shine-consolidate.json"])
    r.stop(single)

    # ---- a replica set whose copy 1 starts joining (memnode --rejoin); `rejoin` fills it
    addrs, copies = [], []
    for copy in (0, 1):
        ready = w / f"rejoin-copy{copy}.addr"
        p, log = r.start(f"rejoin-memnode-c{copy}",
                         ["memnode", "--id", "0", "--replicas", "2", "--copy", str(copy), "--provider", "shm",
                          "--listen", "127.0.0.1:0", "--region", "128MiB", "--ready-file", str(ready)] +
                         (["--rejoin"] if copy else []))
        copies.append(p)
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text().strip()):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"memnode {log.name} not serving:\n{r.tail(log)}")
            time.sleep(0.05)
        addrs.append(ready.read_text().strip())
    r.run("rejoin", ["computenode", "--provider", "shm", "--memnodes", ",".join(addrs), "rejoin", "--memnode", "0",
                     "--copy", "1", "--report", "rejoin.json"])
    r.stop(copies)

    want = ["shine-build.json", "shine-build.json.cn1", "shine-insert.json", "shine-query.json",
            "shine-query-routed.json", "shine-query-routed.json.cn1", "csp-report.json", "shine-route-sim.json",
            "fabric-bench.json", "serve-bench.json", "serve-bench-open.json", "hnswlib-bench.json", "faiss-bench.json",
            "dhnsw-build.json", "dhnsw-build-skipped.json.cn1", "dhnsw-query2.json", "dhnsw-query2.json.cn1",
            "dhnsw-insert.json", "dhnsw-upsert.json", "dhnsw-delete.json", "dhnsw-query.json", "dhnsw-mixed.json", "dhnsw-rebuild.json",
            "dhnsw-build-tool.json", "shine-import.json", "shine-upsert.json", "shine-delete.json", "shine-consolidate.json",
            "rejoin.json"]
    missing = [f for f in want if not (w / f).exists()]
    if missing:
        raise RuntimeError("reports not written: " + ", ".join(missing))
    return [str(w / f) for f in want]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="report files, FILE or FILE=SECTION")
    ap.add_argument("--docs", default=str(REPO / "docs" / "reports.md"), help="the reference page")
    ap.add_argument("--bin", help="make the reports with the binaries in this directory first")
    ap.add_argument("--workdir", help="with --bin: make them here and keep them (default: a temporary "
                                      "directory, removed unless something fails)")
    ap.add_argument("--verbose", action="store_true", help="also list documented paths the reports did not have")
    a = ap.parse_args()
    if not a.files and not a.bin:
        ap.error("give report files or --bin DIR")
    sections = parse_docs(Path(a.docs))
    files = list(a.files)

    if a.bin:
        def on_signal(signum, _frame):
            raise SystemExit(f"signal {signum}")
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, on_signal)
        work = Path(a.workdir).resolve() if a.workdir else Path(tempfile.mkdtemp(prefix="report_fields."))
        work.mkdir(parents=True, exist_ok=True)
        runner = Runner(Path(a.bin).resolve(), work)
        t0 = time.monotonic()
        ok = False
        try:
            files += make_reports(runner)
            ok = True
        except (RuntimeError, OSError) as e:
            print(f"FAIL making the reports: {e}")
            return 1
        finally:
            runner.stop_all()
            if ok:
                print(f"made {len(files) - len(a.files)} reports in {time.monotonic() - t0:.1f} s", flush=True)
            if not ok or a.workdir:
                print(f"kept {work}")
        bad = check(files, sections, a.verbose)
        if bad == 0 and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
        elif bad:
            print(f"kept {work}")
    else:
        bad = check(files, sections, a.verbose)
    if bad:
        print(f"{bad} report(s) with fields docs/reports.md does not list (add them to {a.docs}, in that "
              f"report's section)")
        return 1
    print("every report field is documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
