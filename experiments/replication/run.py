#!/usr/bin/python3
"""Replica sets: what R copies of every memnode cost, and what a copy's death costs (see README.md here).

bigann10k (10,000 x 128 SIFT, l2), 2 memnode ids, each served by R memnodes (`memnode --id L
--replicas R --copy C`; R=2: 4 memnode processes, R=3: 6), computenodes over --provider (cxl)
with the wire model --wire (rdma-100g), one computenode:

  shine build     `computenode --mode shine build --threads 2 --coroutines 4` of all 10,000 rows: inserts/s
  shine query     then `query --k 10 --ef-search 64 --threads 2 --coroutines 4 --cache-ratio 0
                  --repeat-seconds S`: QPS, READs and bytes per query
  d-HNSW insert   on fresh memnodes `computenode --mode dhnsw build --max-elements 8000`, then
                  `insert --begin 8000` (2,000 rows, online rebuilds included): inserts/s
  d-HNSW query    then `query --k 10 --ef-search 64 --probe 2 --batch 1000 --cache-ratio 0`: QPS,
                  READs and bytes per query

for R = 1, 2, 3, in ROUNDS rounds whose R order rotates (1,2,3 / 2,3,1 / 3,1,2), median per R.

Failover: a shine index built once (R=1, cxl, `build --store-index`) is loaded by every copy of
R=2 memnodes over each --failover-providers provider; `computenode --mode shine serve` answers
`serve-bench --clients 4`: a baseline run (no kill), runs of --serve-seconds with SIGKILL of
memnode 1 copy 0 at --kill-at s (failed requests, p99, max), and a series of 1-s serve-bench
runs back to back through the same kill (QPS and p99 over time).

Re-replication (--rejoin-providers): the same R=2 serve (--cn-id 0 --num-cns 1) under `serve-bench
--clients 4` for --rejoin-seconds: SIGKILL of memnode 1 copy 0, a new `memnode --rejoin` at its
address, `computenode --cn-id 1 --num-cns 2 rejoin --memnode 1 --copy 0` (rejoin report: first-pass
GB/s, frozen ms, passes), then SIGKILL of memnode 1 copy 1, the other original (--rejoin-times);
--rejoin-repeats whole runs (failed requests, p99, max) and a series of 1-s serve-bench runs (QPS and
p99 per phase: before, one copy left, new memnode starting, rejoin running, rejoined, new copy only).

Every process started here is stopped at the end, also on errors. Binaries come from --bin
(copy build/bin first when it is being rebuilt: `cp -a build/bin /tmp/repl-bin`).

  experiments/replication/run.py [--bin build/bin] [--rounds 5] [--failover-providers cxl,tcp]
                                 [--rejoin-providers cxl,tcp] [--parts throughput,image-query,failover,rejoin] [--quick]
"""
import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

try:  # the plot needs matplotlib: Debian's python3 has it (python3-matplotlib) when this one does not
    import matplotlib  # noqa: F401
except ImportError:
    if Path(dmh.PYTHON).exists() and Path(sys.executable).resolve() != Path(dmh.PYTHON).resolve():
        os.execv(dmh.PYTHON, [dmh.PYTHON, str(Path(__file__).resolve())] + sys.argv[1:])

HERE = Path(__file__).resolve().parent
SET = "bigann10k"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="bigann10k", choices=["bigann10k", "wordnet", "syn1m"],
                help="data set (default %(default)s; wordnet: 50,000 x 384 sentence embeddings; syn1m: "
                "experiments/scale_1m's 1M x 128 clustered vectors, generated into --work)")
ap.add_argument("--modes", default="shine,dhnsw", help="modes of the throughput part (default %(default)s)")
ap.add_argument("--dhnsw-built", type=int, default=None,
                help="rows of the d-HNSW build; the next 2,000 are inserted (default: all but the last 2,000)")
ap.add_argument("--bin", default=str(dmh.BIN), help="binaries (default %(default)s)")
ap.add_argument("--work", default="/tmp/dmh-replication", help="reports and logs (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/replication.png (default: this folder; "
                "WORK/quick with --quick)")
ap.add_argument("--provider", default="cxl", help="provider of the throughput runs (default %(default)s)")
ap.add_argument("--wire", default="rdma-100g", help="computenode --wire (default %(default)s)")
ap.add_argument("--replicas", default="1,2,3", help="R values of the throughput runs (default %(default)s)")
ap.add_argument("--rounds", type=int, default=5, help="rounds of every R, median reported (default %(default)s)")
ap.add_argument("--memnode-ids", type=int, default=2, help="memnode ids (default %(default)s)")
ap.add_argument("--region", default="256MiB", help="memnode region (default %(default)s)")
ap.add_argument("--query-seconds", type=float, default=3, help="shine query --repeat-seconds (default %(default)s)")
ap.add_argument("--dhnsw-queries", type=int, default=30000,
                help="measured queries of the d-HNSW query run (default %(default)s)")
ap.add_argument("--image-query-providers", default="tcp", help="more providers of the shine query R=1 / R=2 "
                "comparison, on an index loaded from images (no build over them; '' for none; default %(default)s)")
ap.add_argument("--image-query-count", type=int, default=300, help="measured queries of their workload, one pass "
                "(tcp answers ~100 QPS here; default %(default)s)")
ap.add_argument("--failover-providers", default="cxl,tcp", help="providers of the failover runs ('' for none; "
                "default %(default)s)")
ap.add_argument("--failover-repeats", type=int, default=3, help="whole-run kills per provider (default %(default)s)")
ap.add_argument("--serve-seconds", type=float, default=12, help="serve-bench --seconds of a run (default %(default)s)")
ap.add_argument("--kill-at", type=float, default=4, help="SIGKILL of memnode 1 copy 0 this long into the run "
                "(default %(default)s)")
ap.add_argument("--clients", type=int, default=4, help="serve-bench --clients (default %(default)s)")
ap.add_argument("--rejoin-providers", default="cxl,tcp", help="providers of the re-replication runs ('' for none; "
                "default %(default)s)")
ap.add_argument("--rejoin-repeats", type=int, default=2, help="whole-run rejoins per provider, besides the 1-s series "
                "(default %(default)s)")
ap.add_argument("--rejoin-seconds", type=float, default=12, help="serve-bench --seconds of a rejoin run "
                "(default %(default)s)")
ap.add_argument("--rejoin-times", default="3,5,9", help="seconds into a rejoin run: SIGKILL of memnode 1 copy 0, start "
                "of its replacement (`memnode --rejoin` at its address, then `computenode rejoin`), SIGKILL of memnode 1 "
                "copy 1 (not before the rejoin finished; default %(default)s)")
ap.add_argument("--link-wire", default="2,0.25", help="the link-bound part's --wire: links slow enough that one "
                "computenode's shine queries wait for the memnodes' bandwidth, not its CPU ('' to skip; default "
                "%(default)s)")
ap.add_argument("--parts", default="throughput,image-query,link-bound,failover,rejoin",
                help="parts to run (default %(default)s)")
ap.add_argument("--render", default=None, metavar="RESULTS_JSON", help="run nothing: make results.md, the "
                "README's results section and replication.png again from this results.json (its params)")
ap.add_argument("--timeout", type=float, default=180, help="seconds one computenode run may take (default %(default)s)")
ap.add_argument("--quick", action="store_true", help="smoke run (about a minute): 1 round of R=1,2, 1-s queries, "
                "failover over cxl only, 4-s serve runs (kill at 1.5 s); results go to WORK/quick/")
a = ap.parse_args()
if a.quick:
    a.replicas, a.rounds, a.query_seconds, a.dhnsw_queries = "1,2", 1, 1, 5000
    a.failover_providers, a.failover_repeats, a.serve_seconds, a.kill_at = "cxl", 1, 4, 1.5
    a.image_query_count = 100
    a.rejoin_providers, a.rejoin_repeats, a.rejoin_seconds, a.rejoin_times = "cxl", 0, 8, "2,3.5,6"
    a.timeout = min(a.timeout, 90)

dmh.BIN = Path(a.bin).resolve()
BIN = dmh.BIN
work = Path(a.work).resolve() / ("quick" if a.quick else "full")
work.mkdir(parents=True, exist_ok=True)
out = Path(a.out) if a.out else (Path(a.work).resolve() / "quick" if a.quick else HERE)
RS = [int(x) for x in a.replicas.split(",")]
PARTS = set(a.parts.split(","))
T_KILL1, T_REPLACE, T_KILL2 = (float(x) for x in a.rejoin_times.split(","))
PROCS = []  # every process started here (memnodes, computenodes, serve, serve-bench)


def stop(p, grace=10):
    """SIGTERM, then SIGKILL after GRACE s, of one process started here."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in PROCS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def on_signal(sig, _frame):
    raise SystemExit(f"signal {sig}")


signal.signal(signal.SIGTERM, on_signal)


def spawn(cmd, log):
    with open(log, "w") as f:
        f.write(" ".join(map(str, cmd)) + "\n")
        f.flush()
        p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT)
    PROCS.append(p)
    return p


class Cluster:
    """IDS memnode ids x R copies (`memnode --id L --replicas R --copy C`) on 127.0.0.1:0; copy C
    of id L serves load[L] when given. `list`: every copy's address, for --memnodes."""

    def __init__(self, ids, r, provider, region, logdir, load=None, store_dir=None):
        self.dir = Path(logdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs, self.addrs = {}, {}
        try:
            for i in range(ids):
                for c in range(r):
                    ready = self.dir / f"memnode{i}-{c}.addr"
                    ready.unlink(missing_ok=True)
                    cmd = [BIN / "memnode", "--id", i, "--replicas", r, "--copy", c, "--provider", provider,
                           "--listen", "127.0.0.1:0", "--region", region, "--ready-file", ready,
                           "--relay-timeout-ms", 60000]
                    if load is not None:
                        cmd += ["--load", load[i]]
                    if store_dir is not None:
                        cmd += ["--store-dir", store_dir]
                    self.procs[i, c] = spawn(cmd, self.dir / f"memnode{i}-{c}.log")
            for (i, c), p in self.procs.items():
                ready = self.dir / f"memnode{i}-{c}.addr"
                deadline = time.time() + 60
                while not (ready.exists() and ready.read_text().strip()):
                    if p.poll() is not None or time.time() > deadline:
                        raise RuntimeError(f"memnode {i} copy {c} did not start: "
                                           f"{(self.dir / f'memnode{i}-{c}.log').read_text()[-2000:]}")
                    time.sleep(0.05)
                self.addrs[i, c] = ready.read_text().strip()
        except BaseException:
            self.close()
            raise
        self.list = ",".join(self.addrs[k] for k in sorted(self.addrs))
        self.provider, self.region, self.replicas, self.new = provider, region, r, {}

    def replace(self, i, c, timeout=60):
        """A new memnode in dead copy (I, C)'s place: `memnode --rejoin` at its address, same id,
        copy and region, empty (`computenode rejoin` fills it). Returns once it serves."""
        ready = self.dir / f"memnode{i}-{c}-new.addr"
        ready.unlink(missing_ok=True)
        log = self.dir / f"memnode{i}-{c}-new.log"
        p = spawn([BIN / "memnode", "--id", i, "--replicas", self.replicas, "--copy", c, "--rejoin",
                   "--provider", self.provider, "--listen", self.addrs[i, c], "--region", self.region,
                   "--ready-file", ready, "--relay-timeout-ms", 60000], log)
        self.new[i, c] = p
        deadline = time.time() + timeout
        while not (ready.exists() and ready.read_text().strip()):
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the new memnode {i} copy {c} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.02)
        return p

    def kill(self, i, c):
        self.killed = getattr(self, "killed", set()) | {(i, c)}
        self.procs[i, c].send_signal(signal.SIGKILL)

    def foreign_stops(self):
        """Memnodes that stopped although this driver neither stopped nor killed them (the host's
        other users: on this host pids wrap at 32768 while other test runs stop their memnodes)."""
        out = []
        for (i, c), p in self.procs.items():
            if (i, c) in getattr(self, "killed", set()):
                continue
            text = (self.dir / f"memnode{i}-{c}.log").read_text(errors="replace")
            sig = re.search(r"\[(\S+)\] \[memnode[^]]*\] \[info\] got (SIG\w+)", text)
            if sig or p.poll() is not None:
                out.append(f"memnode {i} copy {c} " + (f"got {sig.group(2)} at {sig.group(1)}" if sig else
                                                       f"exited ({p.returncode})"))
        for (i, c), p in getattr(self, "new", {}).items():
            text = (self.dir / f"memnode{i}-{c}-new.log").read_text(errors="replace")
            sig = re.search(r"\[(\S+)\] \[memnode[^]]*\] \[info\] got (SIG\w+)", text)
            if sig or p.poll() is not None:
                out.append(f"new memnode {i} copy {c} " + (f"got {sig.group(2)} at {sig.group(1)}" if sig else
                                                           f"exited ({p.returncode})"))
        return out

    def close(self):
        procs = list(self.procs.values()) + list(getattr(self, "new", {}).values())
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            stop(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cn_cmd(mn, mode, provider, sub, args, wire=None):
    return [BIN / "computenode", "--mode", mode, "--provider", provider, "--wire", wire or a.wire, "--memnodes", mn.list,
            "--cn-id", 0, "--num-cns", 1, sub] + list(args)


def computenode(mn, mode, provider, sub, args, report, log, wire=None):
    """One computenode run; returns its JSON report, plus process_cpu_s: the process's CPU time
    (user + system, from the rusage of the children reaped meanwhile: only this one)."""
    Path(report).unlink(missing_ok=True)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = spawn(cn_cmd(mn, mode, provider, sub, list(args) + ["--report", report], wire), log)
    try:
        p.wait(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise RuntimeError(f"computenode {mode} {sub} did not finish within {a.timeout} s (log {log})")
    if p.returncode != 0:
        foreign = mn.foreign_stops()
        raise RuntimeError(f"computenode {mode} {sub} failed ({p.returncode}):\n{Path(log).read_text()[-3000:]}"
                           + (f"\n{FOREIGN}: {'; '.join(foreign)}" if foreign else ""))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(Path(report).read_text())
    out["process_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return out


FOREIGN = "stopped by a signal this driver did not send"
RETRIES = []  # every retried failure, recorded in results.json


def retried(fn, what, d, attempts=3):
    """FN(k) again (fresh processes) after a transient failure of an overloaded host (dmh.TRANSIENT)
    or a memnode stopped from outside; the failed attempt's logs and reports move to D/failed<k>/."""
    for k in range(attempts):
        try:
            return fn(k)
        except RuntimeError as e:
            why = FOREIGN if FOREIGN in str(e) else next((t for t in dmh.TRANSIENT if t in str(e)), None)
            if k == attempts - 1 or why is None:
                raise
            keep = Path(d) / f"failed{k}"
            keep.mkdir(parents=True, exist_ok=True)
            for f in Path(d).iterdir():
                if f.is_file():
                    f.rename(keep / f.name)
            RETRIES.append({"what": what, "attempt": k, "why": why, "logs": str(keep), "error": str(e)[-1500:]})
            dmh.log(f"  retrying {what}: {why} (logs: {keep})")


SET = a.set
base, _, _, metric = dmh.dataset_files(SET, work)
BUILT = a.dhnsw_built if a.dhnsw_built is not None else {"bigann10k": 8000, "wordnet": 48000, "syn1m": 998000}[SET]
MODES = set(a.modes.split(","))
wl = dmh.shine_workload(SET, work, "uniform", 1000, 100, 5)
wl_dhnsw = dmh.shine_workload(SET, work, "uniform", a.dhnsw_queries, 1000, 5)
wl_small = dmh.shine_workload(SET, work, "uniform", a.image_query_count, 30, 5)
results = {"experiment": "replication", "command": dmh.command_line(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "params": vars(a), "host_cores": os.cpu_count(),
           "binaries": dmh.binaries_identity(("computenode", "memnode", "serve-bench")),
           "throughput": {"rounds": []}, "failover": {}}
t_start = time.time()


def shine_trial(r, tag):
    """Fresh R-copy memnodes: shine build, then shine query."""
    d = work / "throughput" / tag / "shine"
    def go(k):
        with Cluster(a.memnode_ids, r, a.provider, a.region, d / f"mn{k}") as mn:
            b = computenode(mn, "shine", a.provider, "build",
                            ["--data", base, "--metric", metric, "--threads", 2, "--coroutines", 4],
                            d / "build.json", d / "build.log")
            q = computenode(mn, "shine", a.provider, "query",
                            ["--workload", wl, "--k", 10, "--ef-search", 64, "--threads", 2, "--coroutines", 4,
                             "--cache-ratio", 0, "--repeat-seconds", a.query_seconds], d / "query.json", d / "query.log")
        return b, q
    b, q = retried(go, f"{tag} shine", d)
    run = q["runs"][0]
    io = b["per_cn"][0]["io"]
    return {"build_inserts_per_s": b["inserts_per_s"], "build_seconds": b["seconds"],
            "build_io_per_insert": {k: v / b["inserted"] for k, v in io.items()},
            "build_cpu_us_per_insert": b["process_cpu_s"] * 1e6 / b["inserted"],
            "query_qps": run["qps"], "query_recall": run["recall"], "query_latency_us": run["latency_us"],
            "query_per_query": run["per_query"], "query_queries": run["queries"],
            "query_cpu_us_per_query": sum(c["cpu_seconds"] for c in run["per_cn"]) * 1e6 / max(1, run["queries"])}


def dhnsw_trial(r, tag):
    """Fresh R-copy memnodes: d-HNSW build of BUILT rows (8,000 of bigann10k), insert of the next 2,000, query."""
    d = work / "throughput" / tag / "dhnsw"
    def go(k):
        with Cluster(a.memnode_ids, r, a.provider, a.region, d / f"mn{k}") as mn:
            b = computenode(mn, "dhnsw", a.provider, "build", ["--data", base, "--metric", metric, "--max-elements", BUILT],
                            d / "build.json", d / "build.log")
            i = computenode(mn, "dhnsw", a.provider, "insert", ["--data", base, "--begin", BUILT, "--end", BUILT + 2000],
                            d / "insert.json", d / "insert.log")
            q = computenode(mn, "dhnsw", a.provider, "query",
                            ["--workload", wl_dhnsw, "--k", 10, "--ef-search", 64, "--probe", 2, "--batch", 1000,
                             "--cache-ratio", 0], d / "query.json", d / "query.log")
        return b, i, q
    b, i, q = retried(go, f"{tag} d-HNSW", d)
    ins, run = i["insert"], q["runs"][0]
    return {"insert_inserts_per_s": ins["inserts_per_s"], "insert_inserted": ins["inserted"],
            "insert_per_insert": ins["per_insert"], "insert_commits": ins["commits"],
            "insert_rebuilds": len(ins.get("rebuild_reports", [])), "insert_commit_us": ins.get("commit_us"),
            "query_qps": run["qps"], "query_recall": run["recall"], "query_per_query": run["per_query"],
            "query_queries": run["queries"], "query_latency_us": run["latency_us"],
            "insert_cpu_us_per_insert": i["process_cpu_s"] * 1e6 / max(1, ins["inserted"]),
            "query_cpu_us_per_query": q["process_cpu_s"] * 1e6 / max(1, run["queries"])}


def rejoin_phases(res):
    """QPS of a rejoin series by phase: the median QPS of the 1-s serve-bench runs inside the phase
    (or, for phases shorter than a run, of those overlapping it), and its ratio to the runs before
    the copy (every run that ended before the new memnode was started: two copies, then one)."""
    e = res["events_s"]
    segs = [s for s in res["segments"] if not s.get("start_failed")]
    def med_qps(sel):
        return statistics.median([s["qps"] for s in sel]) if sel else None
    def p99s(sel):
        return [s["latency_us"]["p99"] / 1e3 for s in sel if s["latency_us"]]
    def inside(a_, b_):
        return [s for s in segs if s["start_s"] >= a_ and s["end_s"] <= b_]
    def overlapping(a_, b_):
        return [s for s in segs if s["end_s"] > a_ and s["start_s"] < b_]
    big = 1e9
    phases = {"before": inside(-big, e.get("kill1", big)),
              "before_copy": inside(-big, e.get("replace_start", big))}
    if "kill1" in e and "replace_start" in e:
        phases["one_copy"] = inside(e["kill1"], e["replace_start"])
    if "replace_start" in e and "rejoin_start" in e:
        phases["new_memnode_start"] = overlapping(e["replace_start"], e["rejoin_start"])
    if "rejoin_start" in e and "rejoin_end" in e:
        phases["during_rejoin"] = overlapping(e["rejoin_start"], e["rejoin_end"])
        phases["rejoined"] = inside(e["rejoin_end"], e.get("kill2", big))
    if "kill2" in e:
        phases["after_kill2"] = inside(e["kill2"], big)
    ref = med_qps(phases["before_copy"])
    return {k: {"segments": len(v), "qps": med_qps(v),
                "vs_before_copy": (med_qps(v) / ref) if ref and med_qps(v) is not None else None,
                "p99_ms_max": max(p99s(v)) if p99s(v) else None} for k, v in phases.items()}


class Rendered(Exception):
    """--render: no runs; the tables and the plot are made again from a results.json."""


# ---- 1-3: throughput for every R, interleaved
try:
    if a.render:
        raise Rendered
    for rnd in range(a.rounds if "throughput" in PARTS else 0):
        order = RS[rnd % len(RS):] + RS[:rnd % len(RS)]
        row = {}
        for r in order:
            t0 = time.time()
            load0 = os.getloadavg()[0]
            s = shine_trial(r, f"round{rnd}-R{r}")
            h = dhnsw_trial(r, f"round{rnd}-R{r}") if "dhnsw" in MODES else None
            row[r] = {"shine": s, "dhnsw": h, "loadavg_before": load0, "wall_s": time.time() - t0}
            dmh.log(f"round {rnd} R={r}: shine build {s['build_inserts_per_s']:.0f}/s, query {s['query_qps']:.0f} QPS "
                    f"(recall {s['query_recall']:.4f}, {s['query_per_query']['reads']:.0f} READs/q)"
                    + (f"; d-HNSW insert {h['insert_inserts_per_s']:.0f}/s, query {h['query_qps']:.0f} QPS (recall "
                       f"{h['query_recall']:.4f})" if h else "") + f" [load {load0:.1f}, {time.time() - t0:.0f} s]")
        results["throughput"]["rounds"].append(row)

    def med(path, r):
        vals = []
        for row in results["throughput"]["rounds"]:
            x = row[r]
            for k in path:
                x = x[k]
            vals.append(x)
        return statistics.median(vals), vals

    METRICS = {"shine_build": ("shine", "build_inserts_per_s"), "shine_query": ("shine", "query_qps"),
               "dhnsw_insert": ("dhnsw", "insert_inserts_per_s"), "dhnsw_query": ("dhnsw", "query_qps"),
               "shine_recall": ("shine", "query_recall"),
               "shine_query_cpu_us": ("shine", "query_cpu_us_per_query"), "dhnsw_recall": ("dhnsw", "query_recall"),
               "shine_build_cpu_us": ("shine", "build_cpu_us_per_insert"),
               "dhnsw_insert_cpu_us": ("dhnsw", "insert_cpu_us_per_insert"),
               "dhnsw_query_cpu_us": ("dhnsw", "query_cpu_us_per_query")}
    if "dhnsw" not in MODES:
        METRICS = {k: v for k, v in METRICS.items() if v[0] != "dhnsw"}
    summary = {}
    for r in (RS if results["throughput"]["rounds"] else []):
        summary[r] = {}
        for name, path in METRICS.items():
            m, vals = med(path, r)
            summary[r][name] = {"median": m, "all": vals}
        last = results["throughput"]["rounds"][-1][r]
        summary[r]["shine_per_query"] = last["shine"]["query_per_query"]
        summary[r]["shine_build_io_per_insert"] = last["shine"]["build_io_per_insert"]
        if last["dhnsw"]:
            summary[r]["dhnsw_per_query"] = last["dhnsw"]["query_per_query"]
            summary[r]["dhnsw_per_insert"] = last["dhnsw"]["insert_per_insert"]
    # vs R=1: the median over rounds of R's value over R=1's in the same round (the runs of a round
    # are minutes apart at most, so the paired ratio is less exposed to the host's drifting load)
    for r in summary:
        for name in ("shine_build", "shine_query", "dhnsw_insert", "dhnsw_query", "shine_build_cpu_us",
                     "shine_query_cpu_us", "dhnsw_insert_cpu_us", "dhnsw_query_cpu_us"):
            if name not in summary[r]:
                continue
            x = summary[r][name]
            if 1 in RS:
                x["ratios"] = [v / v1 for v, v1 in zip(x["all"], summary[1][name]["all"])]
                x["vs_r1"] = statistics.median(x["ratios"])
            else:
                x["ratios"], x["vs_r1"] = None, None
    results["throughput"]["summary"] = summary

    # ---- 4: failover
    def serve_start(mn, provider, log):
        p = spawn(cn_cmd(mn, "shine", provider, "serve", ["--listen", "127.0.0.1:0", "--ef-search", 64]), log)
        deadline = time.time() + 120
        while True:
            m = re.search(r"serving shine on (\S+)", Path(log).read_text())
            if m:
                return p, m.group(1)
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"serve did not start:\n{Path(log).read_text()[-3000:]}")
            time.sleep(0.05)

    def bench(addr, seconds, j, log, warmup=None):
        cmd = [BIN / "serve-bench", "--target", addr, "--workload", wl, "--clients", a.clients, "--seconds", seconds,
               "--json", j]
        if warmup is not None:
            cmd += ["--warmup-requests", warmup]
        return spawn(cmd, log)

    def bench_result(p, j, log, start_may_fail=False):
        p.wait(timeout=a.serve_seconds + 120)
        if p.returncode == 1 and start_may_fail and "Info failed" in Path(log).read_text():
            # serve-bench's first call (Info) failed: the service answers nothing any more
            line = next(l for l in Path(log).read_text().splitlines() if "Info failed" in l)
            return {"exit": 1, "qps": 0.0, "requests": 1, "requests_ok": 0, "errors": 1, "start_failed": line[-400:],
                    "latency_us": None}
        if p.returncode not in (0, 2):  # 2: some requests failed, the report is written all the same
            raise RuntimeError(f"serve-bench failed ({p.returncode}):\n{Path(log).read_text()[-3000:]}")
        r = json.loads(Path(j).read_text())
        return {"exit": p.returncode, "qps": r["qps"], "requests": r["requests"], "requests_ok": r["requests_ok"],
                "errors": r["errors"], "errors_by_code": r["errors_by_code"], "recall": r["recall"],
                "latency_us": r["latency_us"], "seconds": r["seconds"]}

    def one_second_series(addr, d, seconds, background):
        """SECONDS back-to-back 1-s serve-bench runs (serve-bench's JSON has no time series) while
        BACKGROUND(t0) runs on a thread; the per-run results, and t0."""
        segs, t0 = [], time.time()
        th = threading.Thread(target=background, args=(t0,))
        th.start()
        try:
            for k in range(int(round(seconds))):
                ts = time.time()
                p = bench(addr, 1, d / f"seg{k}.json", d / f"seg{k}.log", warmup=100 if k == 0 else 0)
                s = bench_result(p, d / f"seg{k}.json", d / f"seg{k}.log", start_may_fail=True)
                if s.get("start_failed"):
                    time.sleep(max(0.0, ts + 1 - time.time()))  # keep the time axis
                s.update({"start_s": ts - t0, "end_s": time.time() - t0})
                segs.append(s)
        finally:
            th.join()
        return segs, t0

    def detection(serve_log, t_kill):
        """The serve log's first line declaring memnode 1 copy 0 dead, and its delay after T_KILL."""
        for line in Path(serve_log).read_text().splitlines():
            if "memnode 1 copy 0" in line and ("unreachable" in line or "dead" in line or "fenced" in line):
                m = re.match(r"\[(\d\d):(\d\d):(\d\d\.\d+)\]", line)
                if not m:
                    return line, None
                lt = time.localtime(t_kill)
                day0 = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, lt.tm_isdst))
                t = day0 + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
                return line, t - t_kill
        return None, None

    def failover_trial(provider, images, kind, tag):
        """kind: baseline (no kill), whole (one serve-bench run, kill at --kill-at) or series (1-s
        serve-bench runs back to back, the same kill)."""
        d = work / "failover" / provider / tag
        d.mkdir(parents=True, exist_ok=True)
        with Cluster(a.memnode_ids, 2, provider, a.region, d / "mn", load=images) as mn:
            sp, addr = serve_start(mn, provider, d / "serve.log")
            try:
                res = {"kind": kind, "provider": provider, "kill_at_s": None if kind == "baseline" else a.kill_at}
                t_kill = [None]
                def killer(t0):
                    time.sleep(max(0.0, t0 + a.kill_at - time.time()))
                    mn.kill(1, 0)
                    t_kill[0] = time.time()
                if kind in ("baseline", "whole"):
                    p = bench(addr, a.serve_seconds, d / "bench.json", d / "bench.log")
                    t0 = time.time()  # serve-bench's warm-up (100 requests, ~0.1 s) comes first
                    th = threading.Thread(target=killer, args=(t0,)) if kind == "whole" else None
                    if th:
                        th.start()
                    try:
                        res.update(bench_result(p, d / "bench.json", d / "bench.log"))
                    finally:
                        if th:
                            th.join()
                else:
                    segs, t0 = one_second_series(addr, d, a.serve_seconds, killer)
                    res["segments"] = segs
                    res["errors"] = sum(s["errors"] for s in segs)
                    res["requests"] = sum(s["requests"] for s in segs)
                if t_kill[0] is not None:
                    res["kill_s"] = t_kill[0] - t0
                    line, delay = detection(d / "serve.log", t_kill[0])
                    res["detected_line"], res["detected_after_s"] = line, delay
                res["foreign_stops"] = mn.foreign_stops()
                res["serve_alive"] = sp.poll() is None
                res["killed_memnode_exit"] = mn.procs[1, 0].poll()
            finally:
                stop(sp, grace=15)
            res["serve_exit"] = sp.returncode
        res["log_dir"] = str(d)
        return res

    provs = [p for p in a.failover_providers.split(",") if p and "failover" in PARTS]
    iprovs = [p for p in a.image_query_providers.split(",") if p and "image-query" in PARTS]
    # (key in results["image_query"], provider, wire, workload): the link-bound cell is cxl with slow links
    iq_cells = [(p, p, a.wire, wl_small) for p in iprovs]
    if "link-bound" in PARTS and a.link_wire:
        iq_cells.append((f"cxl, --wire {a.link_wire}", "cxl", a.link_wire, wl))
    rprovs = [p for p in a.rejoin_providers.split(",") if p and "rejoin" in PARTS]
    if provs or iq_cells or rprovs:
        idx = work / "failover" / "index"
        images = [idx / f"memnode-{i}.img" for i in range(a.memnode_ids)]
        if not all(p.exists() for p in images):
            def build(k):
                with Cluster(a.memnode_ids, 1, "cxl", a.region, idx / f"mn{k}", store_dir=idx) as mn:
                    return computenode(mn, "shine", "cxl", "build",
                                       ["--data", base, "--metric", metric, "--threads", 2, "--coroutines", 4,
                                        "--store-index", idx], idx / "build.json", idx / "build.log")
            retried(build, "the failover index", idx)
        results["failover"]["index"] = str(idx)

    # ---- 3b: shine query R=1 / R=2 over providers where the transport, not the computenode, may bind
    def image_query(provider, wire, workload, r, tag):
        d = work / "image_query" / f"{provider}-{wire}" / tag
        def go(k):
            with Cluster(a.memnode_ids, r, provider, a.region, d / f"mn{k}", load=images) as mn:
                return computenode(mn, "shine", provider, "query",
                                   ["--workload", workload, "--k", 10, "--ef-search", 64, "--threads", 2,
                                    "--coroutines", 4, "--cache-ratio", 0],  # one pass: --repeat-seconds S queues
                                   # S seconds of queries, which a slow transport answers for much longer
                                   d / "query.json", d / "query.log", wire=wire)
        q = retried(go, f"{provider} {wire} {tag} query", d)
        run = q["runs"][0]
        mcpu = q.get("memnode_cpu") or {}
        return {"qps": run["qps"], "recall": run["recall"], "per_query": run["per_query"], "queries": run["queries"],
                "latency_us": run["latency_us"],
                "cpu_us_per_query": sum(c["cpu_seconds"] for c in run["per_cn"]) * 1e6 / max(1, run["queries"]),
                "memnode_cpu_us_per_query": sum(mcpu.get("seconds", [])) * 1e6 / max(1, run["queries"]),
                "memnode_cores": sum(mcpu.get("seconds", [])) / mcpu["wall_s"] if mcpu.get("wall_s") else None}
    for key, prov, wire, workload in iq_cells:
        # tcp answers ~100 QPS here: R = 1 and 2 only; the link-bound cell every R
        IRS = [r for r in RS if r <= 2] if 2 in RS and prov == "tcp" else RS
        rounds = []
        for rnd in range(a.rounds):
            order = IRS[rnd % len(IRS):] + IRS[:rnd % len(IRS)]
            row = {}
            for r in order:
                t0 = time.time()
                row[r] = image_query(prov, wire, workload, r, f"round{rnd}-R{r}")
                x = row[r]
                dmh.log(f"{key} query round {rnd} R={r}: {x['qps']:.0f} QPS (recall {x['recall']:.4f}), computenode "
                        f"{x['cpu_us_per_query']:.0f} µs CPU/query, memnodes {x['memnode_cpu_us_per_query']:.0f} µs "
                        f"CPU/query ({time.time() - t0:.0f} s)")
            rounds.append(row)
        summ = {}
        for r in IRS:
            vals = [row[r]["qps"] for row in rounds]
            summ[r] = {"qps": {"median": statistics.median(vals), "all": vals},
                       "cpu_us_per_query": statistics.median(row[r]["cpu_us_per_query"] for row in rounds),
                       "memnode_cpu_us_per_query": statistics.median(row[r]["memnode_cpu_us_per_query"] for row in rounds),
                       "recall": statistics.median(row[r]["recall"] for row in rounds),
                       "per_query": rounds[-1][r]["per_query"]}
        for r in IRS:
            summ[r]["qps"]["vs_r1"] = summ[r]["qps"]["median"] / summ[IRS[0]]["qps"]["median"] if 1 in IRS else None
        results.setdefault("image_query", {})[key] = {"rounds": rounds, "summary": summ, "provider": prov,
                                                      "wire": wire, "measured_queries": rounds[0][IRS[0]]["queries"]}

    for prov in provs:
        runs = []
        for kind, tag in ([("baseline", "baseline")] + [("whole", f"kill{k}") for k in range(a.failover_repeats)]
                          + [("series", "series")]):
            t0 = time.time()
            r = failover_trial(prov, images, kind, tag)
            runs.append(r)
            lat = r.get("latency_us", {})
            dmh.log(f"failover {prov} {tag}: {r['requests']} requests, {r['errors']} failed"
                    + (f", QPS {r['qps']:.0f}, p99 {lat['p99'] / 1e3:.1f} ms, max {lat['max'] / 1e3:.1f} ms"
                       if lat else "")
                    + (f", kill at {r['kill_s']:.2f} s, detected after "
                       f"{r['detected_after_s'] if r['detected_after_s'] is None else round(r['detected_after_s'], 3)} s"
                       if r.get("kill_s") is not None else "") + f" ({time.time() - t0:.0f} s)")
        results["failover"][prov] = runs

    # ---- 5: re-replication: kill a copy, a new memnode takes its place (`computenode rejoin`), kill the other
    def log_time(line, t_ref):
        """The epoch time of a log line's [HH:MM:SS.fff] stamp (the day of T_REF)."""
        m = re.match(r"\[(\d\d):(\d\d):(\d\d\.\d+)\]", line)
        if not m:
            return None
        lt = time.localtime(t_ref)
        day0 = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, lt.tm_isdst))
        return day0 + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))

    def log_event(log, t_ref, *needles):
        """The first line of LOG containing every NEEDLE, and its time relative to T_REF (s)."""
        if not Path(log).exists():
            return None, None
        for line in Path(log).read_text(errors="replace").splitlines():
            if all(n in line for n in needles):
                t = log_time(line, t_ref)
                return line, None if t is None else t - t_ref
        return None, None

    def wait_rusage(p, timeout):
        """Waits for P (at most TIMEOUT s, then kills it); returns its CPU seconds (user + system)."""
        deadline = time.time() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                return ru.ru_utime + ru.ru_stime
            if time.time() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                return None
            time.sleep(0.01)

    def rejoin_trial(provider, images, kind, tag):
        """kind: whole (one serve-bench run of --rejoin-seconds) or series (1-s serve-bench runs back
        to back), both through: SIGKILL of memnode 1 copy 0, its replacement and `computenode
        rejoin` (--cn-id 1 --num-cns 2; serve is cn 0), SIGKILL of memnode 1 copy 1."""
        d = work / "rejoin" / provider / tag
        d.mkdir(parents=True, exist_ok=True)
        with Cluster(a.memnode_ids, 2, provider, a.region, d / "mn", load=images) as mn:
            sp, addr = serve_start(mn, provider, d / "serve.log")
            try:
                res = {"kind": kind, "provider": provider, "times": [T_KILL1, T_REPLACE, T_KILL2]}
                ev, rj = {}, {}

                def until(t):
                    time.sleep(max(0.0, t - time.time()))

                def driver(t0):
                    try:
                        until(t0 + T_KILL1)
                        mn.kill(1, 0)
                        ev["kill1"] = time.time()
                        mn.procs[1, 0].wait()
                        until(t0 + T_REPLACE)
                        ev["replace_start"] = time.time()
                        mn.replace(1, 0)
                        ev["replace_ready"] = time.time()
                        report = d / "rejoin.json"
                        report.unlink(missing_ok=True)
                        report.with_name(report.name + ".cn1").unlink(missing_ok=True)
                        cmd = [BIN / "computenode", "--mode", "shine", "--provider", provider, "--wire", a.wire,
                               "--memnodes", mn.list, "--cn-id", 1, "--num-cns", 2, "rejoin", "--memnode", 1,
                               "--copy", 0, "--report", report]
                        ev["rejoin_start"] = time.time()
                        p = spawn(cmd, d / "rejoin.log")
                        rj["cpu_s"] = wait_rusage(p, a.timeout)
                        ev["rejoin_end"] = time.time()
                        rj["exit"] = p.returncode
                        if p.returncode == 0:
                            # a computenode other than cn 0 writes its report to FILE.cn<id>
                            rfile = next((f for f in (report, report.with_name(report.name + ".cn1")) if f.exists()),
                                         report)
                            rj["report"] = json.loads(rfile.read_text())
                            until(t0 + T_KILL2)
                            mn.kill(1, 1)
                            ev["kill2"] = time.time()
                        else:
                            rj["error"] = Path(d / "rejoin.log").read_text(errors="replace")[-3000:]
                            dmh.log(f"  rejoin {provider} {tag} failed ({p.returncode}); memnode 1 copy 1 not killed")
                    except BaseException as e:  # noqa: BLE001 -- reported in the results
                        rj["error"] = f"{type(e).__name__}: {e}"

                if kind == "whole":
                    p = bench(addr, a.rejoin_seconds, d / "bench.json", d / "bench.log")
                    t0 = time.time()  # serve-bench's warm-up (100 requests, ~0.1 s) comes first
                    th = threading.Thread(target=driver, args=(t0,))
                    th.start()
                    try:
                        res.update(bench_result(p, d / "bench.json", d / "bench.log"))
                    finally:
                        th.join()
                else:
                    segs, t0 = one_second_series(addr, d, a.rejoin_seconds, driver)
                    res["segments"] = segs
                    res["errors"] = sum(s["errors"] for s in segs)
                    res["requests"] = sum(s["requests"] for s in segs)
                res["events_s"] = {k: v - t0 for k, v in ev.items()}
                res["rejoin"] = {k: v for k, v in rj.items() if k != "report"}
                rep = rj.get("report") or {}
                for k in ("first_pass_gbytes_per_s", "first_pass_bytes", "first_pass_seconds", "frozen_ms", "passes",
                          "recopied_bytes", "final_bytes", "seconds", "region_bytes", "chunk_bytes"):
                    res["rejoin"][k] = rep.get(k)
                res["rejoin"]["ok"] = rj.get("exit") == 0 and "error" not in rj
                if "rejoin_start" in ev and "rejoin_end" in ev:
                    res["rejoin"]["process_wall_s"] = ev["rejoin_end"] - ev["rejoin_start"]
                # what the serving computenode logged: the deaths, the new copy joining and full
                sl = d / "serve.log"
                logs = {"copy0_dead": ("memnode 1 copy 0", "unreachable"),
                        "copy0_joining": ("memnode 1 copy 0", "joining its set"),
                        "copy0_full": ("memnode 1 copy 0", "rejoined its set"),
                        "copy1_dead": ("memnode 1 copy 1", "unreachable")}
                res["serve_log"] = {}
                for name, needles in logs.items():
                    line, when = log_event(sl, t0, *needles)
                    res["serve_log"][name] = {"line": line, "at_s": when}
                res["serve_log_warnings"] = [l for l in sl.read_text(errors="replace").splitlines()
                                             if "[warning]" in l or "[error]" in l][:40]
                res["foreign_stops"] = mn.foreign_stops()
                res["serve_alive"] = sp.poll() is None
                res["new_memnode_alive"] = mn.new.get((1, 0)) is not None and mn.new[1, 0].poll() is None
            finally:
                stop(sp, grace=15)
            res["serve_exit"] = sp.returncode
        res["log_dir"] = str(d)
        if kind == "series":
            res["phases"] = rejoin_phases(res)
        return res

    for prov in rprovs:
        runs = []
        for kind, tag in [("whole", f"rejoin{k}") for k in range(a.rejoin_repeats)] + [("series", "series")]:
            t0 = time.time()
            load0 = os.getloadavg()[0]
            r = rejoin_trial(prov, images, kind, tag)
            r["loadavg_before"] = load0
            runs.append(r)
            x, e = r["rejoin"], r["events_s"]
            lat = r.get("latency_us") or {}
            dmh.log(f"rejoin {prov} {tag}: {r['requests']} requests, {r['errors']} failed"
                    + (f", QPS {r['qps']:.0f}, p99 {lat['p99'] / 1e3:.1f} ms, max {lat['max'] / 1e3:.1f} ms" if lat else "")
                    + (f"; rejoin {x['first_pass_gbytes_per_s']:.2f} GB/s first pass, frozen {x['frozen_ms']:.1f} ms, "
                       f"{x['passes']} passes, {x['seconds']:.2f} s" if x.get("ok") and x.get("seconds") is not None
                       else f"; rejoin FAILED: {x.get('error', '')[-300:]}")
                    + f"; events {', '.join(f'{k} {v:.2f}' for k, v in e.items())}"
                    + ("; phases " + ", ".join(f"{k} {v['qps']:.0f}" for k, v in r["phases"].items() if v["qps"])
                       if r.get("phases") else "")
                    + f" [load {load0:.1f}, {time.time() - t0:.0f} s]")
        results.setdefault("rejoin", {})[prov] = runs
except Rendered:
    pass
finally:
    stop_all()

# ---- results
if a.render:
    results = json.loads(Path(a.render).read_text())
    keep = {k: getattr(a, k) for k in ("bin", "out", "work", "render")}
    vars(a).update(results["params"])
    vars(a).update(keep)
    RS = [int(x) for x in a.replicas.split(",")]
    T_KILL1, T_REPLACE, T_KILL2 = (float(x) for x in a.rejoin_times.split(","))
    RETRIES[:] = results.get("retries", [])
    ints = lambda d: {int(k): v for k, v in d.items()}  # noqa: E731 -- JSON made the R keys strings
    if results["throughput"].get("summary"):
        results["throughput"]["summary"] = ints(results["throughput"]["summary"])
        results["throughput"]["rounds"] = [ints(row) for row in results["throughput"]["rounds"]]
    for x in results.get("image_query", {}).values():
        x["summary"] = ints(x["summary"])
        x["rounds"] = [ints(row) for row in x["rounds"]]
    results["rendered"] = time.strftime("%Y-%m-%d %H:%M")
    for runs in results.get("rejoin", {}).values():
        for r in runs:
            if r["kind"] == "series":
                r["phases"] = rejoin_phases(r)
else:
    results["seconds"] = time.time() - t_start
    results["retries"] = RETRIES
checks = []
S = results["throughput"].get("summary") or {}
if 1 in RS and S:
    for r in RS[1:]:
        if r == 2:
            checks.append({"what": "shine build inserts/s, R=2 >= 0.7x R=1", "value": f"{S[2]['shine_build']['vs_r1']:.2f}x",
                           "ok": S[2]["shine_build"]["vs_r1"] >= 0.7})
            for n, lab in (("shine_query", "shine query QPS"), ("dhnsw_query", "d-HNSW query QPS")):
                if n not in S[2]:
                    continue
                checks.append({"what": f"{lab}, R=2 >= 1.0x R=1", "value": f"{S[2][n]['vs_r1']:.2f}x",
                               "ok": S[2][n]["vs_r1"] >= 1.0})
for prov, x in results.get("image_query", {}).items():
    if 2 in x["summary"] and x["summary"][2]["qps"]["vs_r1"] is not None:
        v = x["summary"][2]["qps"]["vs_r1"]
        checks.append({"what": f"shine query QPS over {prov}, R=2 >= 1.0x R=1", "value": f"{v:.2f}x", "ok": v >= 1.0})
        if prov.startswith("cxl, --wire") and 3 in x["summary"]:
            v = x["summary"][3]["qps"]["vs_r1"]
            checks.append({"what": f"shine query QPS over {prov}, R=3 >= 1.0x R=1", "value": f"{v:.2f}x",
                           "ok": v >= 1.0})
for prov, runs in results["failover"].items():
    if isinstance(runs, list):
        n = sum(r["errors"] for r in runs if r["kind"] != "baseline")
        checks.append({"what": f"failed requests through a copy's SIGKILL ({prov})", "value": str(n), "ok": n == 0})
for prov, runs in results.get("rejoin", {}).items():
    n = sum(r["errors"] for r in runs)
    checks.append({"what": f"failed requests through kill / rejoin / kill of the other copy ({prov})", "value": str(n),
                   "ok": n == 0})
    ok = sum(1 for r in runs if r["rejoin"]["ok"])
    checks.append({"what": f"rejoins that completed ({prov})", "value": f"{ok} of {len(runs)}", "ok": ok == len(runs)})
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
if not a.render:
    results["binaries_after"] = dmh.binaries_identity(("computenode", "memnode", "serve-bench"))
results["binaries_changed"] = sorted(k for k in results["binaries_after"]
                                     if results["binaries"].get(k) != results["binaries_after"][k])

f0 = lambda x: f"{x:,.0f}"  # noqa: E731
md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min, host with {os.cpu_count()} cores): "
      f"`{results['command']}`\n\n"
      f"{SET}, {a.memnode_ids} memnode ids x R copies over `{a.provider}` with `--wire {a.wire}`, one computenode; "
      f"median of {a.rounds} round(s) (R order rotated each round; every round's value in brackets); vs R=1: the "
      f"median over the rounds of the ratio to R=1 in the same round.\n\n"]
if not S:
    md = [md[0].split("\n\n")[0] + "\n\n"]
hdr = ["R", "memnode processes", "shine build inserts/s", "vs R=1", "d-HNSW insert inserts/s", "vs R=1",
       "shine query QPS", "vs R=1", "d-HNSW query QPS", "vs R=1"]
rows = []
for r in (RS if S else []):
    s = S[r]
    cell = lambda n: "—" if n not in s else f"**{f0(s[n]['median'])}** ({' / '.join(f0(v) for v in s[n]['all'])})"  # noqa: E731
    vs = lambda n: "—" if n not in s or s[n]["vs_r1"] is None else f"{s[n]['vs_r1']:.2f}x"  # noqa: E731
    rows.append([r, r * a.memnode_ids, cell("shine_build"), vs("shine_build"), cell("dhnsw_insert"), vs("dhnsw_insert"),
                 cell("shine_query"), vs("shine_query"), cell("dhnsw_query"), vs("dhnsw_query")])
if S:
    md.append(dmh.md_table(hdr, rows))
    md.append("\nCPU time of the computenode per operation (the resource that binds on this host; shine query: the "
              "measured phase, from its report; the others: the whole process, from its rusage, so including start-up, "
              "reading the data and, for the d-HNSW query, 1,000 warm-up queries), median, and vs R=1 as above:\n\n")
    rows = []
    for r in RS:
        s = S[r]
        cpu = lambda n: "—" if n not in s else (f"**{s[n]['median']:.0f}**"  # noqa: E731
                                                + ("" if s[n]["vs_r1"] is None else f" ({s[n]['vs_r1']:.2f}x)"))
        rows.append([r, cpu("shine_build_cpu_us"), cpu("dhnsw_insert_cpu_us"), cpu("shine_query_cpu_us"),
                     cpu("dhnsw_query_cpu_us")])
    md.append(dmh.md_table(["R", "shine build µs/insert", "d-HNSW insert µs/insert", "shine query µs/query",
                            "d-HNSW query µs/query"], rows))
    md.append("\nPer operation (last round): shine build I/O per insert, query READs / doorbells / KiB per query "
              "(the computenode's logical operations: a WRITE to R copies counts once), recall@10 (median):\n\n")
    rows = []
    for r in RS:
        s = S[r]
        bi, sq, dq, di = s["shine_build_io_per_insert"], s["shine_per_query"], s.get("dhnsw_per_query"), s.get("dhnsw_per_insert")
        rows.append([r, f"{bi['reads']:.0f} / {bi['writes']:.1f} / {bi['atomics']:.1f} / {bi['bytes'] / 1024:.1f}",
                     f"{sq['reads']:.0f} / {sq['doorbells']:.0f} / {sq['bytes'] / 1024:.0f}",
                     f"{s['shine_recall']['median']:.4f}",
                     f"{di['writes']:.2f} / {di['bytes_written']:.0f}" if di else "—",
                     f"{dq['reads']:.3f} / {dq['bytes'] / 1024:.1f}" if dq else "—",
                     f"{s['dhnsw_recall']['median']:.4f}" if "dhnsw_recall" in s else "—"])
    md.append(dmh.md_table(["R", "shine build: READs / WRITEs / atomics / KiB per insert",
                            "shine query: READs / doorbells / KiB", "shine recall@10",
                            "d-HNSW insert: WRITEs / bytes per insert", "d-HNSW query: READs / KiB", "d-HNSW recall@10"],
                           rows))
for key, x in results.get("image_query", {}).items():
    prov, wire = x.get("provider", key), x.get("wire", a.wire)
    md.append(f"\nShine query over `{prov}` (`--wire {wire}`), the index loaded from images (built once over cxl), "
              f"one pass of {x.get('measured_queries', a.image_query_count)} measured queries, median of {a.rounds} "
              f"round(s); CPU time per query of the computenode and of all memnodes together:\n\n")
    rows = []
    for r, y in x["summary"].items():
        rows.append([r, f"**{f0(y['qps']['median'])}** ({' / '.join(f0(v) for v in y['qps']['all'])})",
                     "—" if y["qps"]["vs_r1"] is None else f"{y['qps']['vs_r1']:.2f}x",
                     f"{y['cpu_us_per_query']:.0f}", f"{y['memnode_cpu_us_per_query']:.0f}",
                     f"{y['per_query']['reads']:.0f} / {y['per_query']['bytes'] / 1024:.0f}", f"{y['recall']:.4f}"])
    md.append(dmh.md_table(["R", "QPS", "vs R=1", "computenode CPU µs/query", "memnodes CPU µs/query",
                            "READs / KiB per query", "recall@10"], rows))
fo = {k: v for k, v in results["failover"].items() if isinstance(v, list)}
if fo:
    md.append(f"\nFailover: shine `serve` on R=2 ({a.memnode_ids} ids x 2 copies, index loaded from images), "
              f"`serve-bench --clients {a.clients} --seconds {a.serve_seconds:g}`, SIGKILL of memnode 1 copy 0 at "
              f"{a.kill_at:g} s (series: {int(round(a.serve_seconds))} serve-bench runs of 1 s back to back):\n\n")
    rows = []
    for prov, runs in fo.items():
        for r in runs:
            lat = r.get("latency_us")
            if r["kind"] == "series":
                segs = [s for s in r["segments"] if s["latency_us"]]
                lat_s = f"worst 1-s p99 {max(s['latency_us']['p99'] for s in segs) / 1e3:.1f}" if segs else "—"
                mx = f"{max(s['latency_us']['max'] for s in segs) / 1e3:.1f}" if segs else "—"
                qps = (f"{min(s['qps'] for s in r['segments']):,.0f} – {max(s['qps'] for s in r['segments']):,.0f} "
                       f"(per second)")
                nf = sum(1 for s in r["segments"] if s.get("start_failed"))
                if nf:
                    qps += f"; {nf} of {len(r['segments'])} runs could not start (Info call failed)"
            else:
                lat_s, mx, qps = f"{lat['p99'] / 1e3:.1f}", f"{lat['max'] / 1e3:.1f}", f0(r["qps"])
            det = r.get("detected_after_s")
            rows.append([prov, r["kind"], "—" if r.get("kill_s") is None else f"{r['kill_s']:.2f}",
                         f"{r['requests']:,}", f"**{r['errors']}**", qps, lat_s, mx,
                         "—" if r.get("kill_s") is None else ("not logged" if det is None else f"{det * 1e3:.0f} ms"),
                         "yes" if r["serve_alive"] else "NO"])
    md.append(dmh.md_table(["provider", "run", "kill at s", "requests", "failed", "QPS", "p99 ms", "max ms",
                            "copy declared dead after", "serve alive"], rows))
rjr = results.get("rejoin", {})
if rjr:
    md.append(f"\nRe-replication: shine `serve` (cn 0) on R=2 ({a.memnode_ids} ids x 2 copies, index loaded from images, "
              f"region {a.region}), `serve-bench --clients {a.clients}` for {a.rejoin_seconds:g} s (series: "
              f"{int(round(a.rejoin_seconds))} serve-bench runs of 1 s back to back); SIGKILL of memnode 1 copy 0 at "
              f"{T_KILL1:g} s; at {T_REPLACE:g} s `memnode --rejoin` at its address, then `computenode --cn-id 1 "
              f"--num-cns 2 rejoin --memnode 1 --copy 0`; SIGKILL of memnode 1 copy 1 (the other original) at "
              f"{T_KILL2:g} s once the rejoin is over. Times in s from the start of the measurement; first pass: "
              f"the whole region copied while serve goes on:\n\n")
    rows = []
    for prov, runs in rjr.items():
        for r in runs:
            x, e = r["rejoin"], r["events_s"]
            lat = r.get("latency_us")
            if r["kind"] == "series":
                segs = [s for s in r["segments"] if s["latency_us"]]
                lat_s = f"worst 1-s p99 {max(s['latency_us']['p99'] for s in segs) / 1e3:.1f}" if segs else "—"
                mx = f"{max(s['latency_us']['max'] for s in segs) / 1e3:.1f}" if segs else "—"
                qps = f"{min(s['qps'] for s in r['segments']):,.0f} – {max(s['qps'] for s in r['segments']):,.0f} (1-s)"
            else:
                lat_s, mx, qps = (f"{lat['p99'] / 1e3:.1f}", f"{lat['max'] / 1e3:.1f}", f0(r["qps"])) if lat else ("—",) * 3
            ok = x.get("ok") and x.get("seconds") is not None
            ev = lambda k: f"{e[k]:.2f}" if k in e else "—"  # noqa: E731
            full = (r.get("serve_log") or {}).get("copy0_full", {}).get("at_s")
            rows.append([prov, r["kind"], f"{r['requests']:,}", f"**{r['errors']}**", qps, lat_s, mx,
                         f"{ev('kill1')} / {ev('rejoin_start')}–{ev('rejoin_end')} / {ev('kill2')}",
                         f"**{x['first_pass_gbytes_per_s']:.2f}**" if ok else "**failed**",
                         f"{x['first_pass_seconds']:.2f}" if ok else "—",
                         f"{x['passes']} / {x['recopied_bytes'] / 1048576:.1f}" if ok else "—",
                         f"**{x['frozen_ms']:.1f}**" if ok else "—",
                         f"{x['seconds']:.2f} ({x['process_wall_s']:.2f})" if ok else "—",
                         "—" if full is None else f"{full:.2f}",
                         "yes" if r["serve_alive"] else "NO", f"{r.get('loadavg_before', float('nan')):.1f}"])
    md.append(dmh.md_table(["provider", "run", "requests", "failed", "QPS", "p99 ms", "max ms",
                            "kill / rejoin process / kill at s", "first pass GB/s", "first pass s",
                            "passes / MiB recopied", "frozen ms", "rejoin s (process)", "serve: full copy at s",
                            "serve alive", "load avg"], rows))
    ph_names = [("before", "before the 1st kill"), ("one_copy", "one copy left"), ("before_copy", "before the copy (both)"),
                ("new_memnode_start", "new memnode starting (overlap)"),
                ("during_rejoin", "rejoin process running (overlap)"), ("rejoined", "rejoined, 2 copies"),
                ("after_kill2", "after the 2nd kill (new copy only)")]
    ser = [(prov, next((r for r in runs if r["kind"] == "series" and r.get("phases")), None)) for prov, runs in rjr.items()]
    ser = [(p_, r) for p_, r in ser if r]
    if ser:
        md.append("\nQPS of the series by phase: median of the 1-s serve-bench runs inside the phase, or, marked "
                  "(overlap), of those overlapping it (the phase is shorter than a run); in brackets: vs the runs "
                  "before the copy (every run that ended before the new memnode was started), and the worst 1-s p99 "
                  "in ms:\n\n")
        rows = []
        for prov, r in ser:
            cells = []
            for k, _ in ph_names:
                y = r["phases"].get(k)
                cells.append("—" if not y or y["qps"] is None else
                             f"{y['qps']:,.0f} ({y['vs_before_copy']:.2f}x; {y['p99_ms_max']:.1f})")
            rows.append([prov] + cells)
        md.append(dmh.md_table(["provider"] + [n for _, n in ph_names], rows))
    bad = [(p_, r) for p_, runs in rjr.items() for r in runs if r["errors"] or not r["rejoin"]["ok"]]
    for p_, r in bad:
        md.append(f"\n{p_} {r['kind']} ({r['log_dir']}): {r['errors']} failed requests"
                  + ("" if r["rejoin"]["ok"] else f"; rejoin failed: `{(r['rejoin'].get('error') or '')[-400:]}`")
                  + (f"; errors by code {r.get('errors_by_code')}" if r.get("errors_by_code") else "")
                  + ".\n")
if RETRIES:
    md.append(f"\nRetried after a failure with fresh processes: " + "; ".join(
        f"{x['what']} ({x['why']})" for x in RETRIES) + " (`retries` in results.json).\n")
foreign = [(p_, r["kind"], r["foreign_stops"]) for p_, runs in list(fo.items()) + [(f"rejoin {k}", v) for k, v in
                                                                                  rjr.items()]
           for r in runs if r.get("foreign_stops")]
if foreign:
    md.append("\nFailover runs with a memnode stopped from outside: " + "; ".join(f"{p_} {k}: {', '.join(f)}"
                                                                               for p_, k, f in foreign) + ".\n")
md.append("\nChecks:\n\n" + "".join(f"- {c['what']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n" for c in checks))
if results["binaries_changed"]:
    md.insert(0, f"**Warning:** {', '.join(results['binaries_changed'])} changed in {BIN} during the run.\n\n")
md.append("\n![throughput per R, and QPS / p99 through a copy's SIGKILL](replication.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    series = {p: next(r for r in runs if r["kind"] == "series") for p, runs in fo.items()
              if any(r["kind"] == "series" for r in runs)}
    rser = {p: next(r for r in runs if r["kind"] == "series") for p, runs in rjr.items()
            if any(r["kind"] == "series" for r in runs)}
    ncol = 3 if (series or rser) else 1
    nrow = 2 if rjr else 1
    fig, grid = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    axes = list(grid[0])
    if series:
        axes[2].sharex(axes[1])
    elif ncol > 1:
        axes[1].axis("off")
        axes[2].axis("off")
    ax = axes[0]
    if not S:
        ax.axis("off")
    else:
        names = [("shine_build", "shine build"), ("dhnsw_insert", "d-HNSW insert"), ("shine_query", "shine query"),
                 ("dhnsw_query", "d-HNSW query")]
        S2 = {r: dict(S[r]) for r in RS}
        for prov, x in results.get("image_query", {}).items():
            names.append((f"iq_{prov}", f"shine query\n({prov})" if "," not in prov
                          else f"shine query\n(cxl, {x.get('wire')})"))
            for r in RS:
                S2[r][f"iq_{prov}"] = ({"median": x["summary"][r]["qps"]["median"], "vs_r1": x["summary"][r]["qps"]["vs_r1"]}
                                      if r in x["summary"] else None)
        w = 0.8 / len(RS)
        for i, r in enumerate(RS):
            idx_ = [j for j, (n, _) in enumerate(names) if S2[r].get(n)]
            xs = [j + (i - (len(RS) - 1) / 2) * w for j in idx_]
            vals = [S2[r][names[j][0]]["vs_r1"] or 0 for j in idx_]
            bars = ax.bar(xs, vals, w, label=f"R={r}", color=["0.55", "C0", "C3", "C2"][i % 4])
            ax.bar_label(bars, labels=[f0(S2[r][names[j][0]]["median"]) for j in idx_], fontsize=6, rotation=90, padding=2)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.axhline(0.7, color="C3", lw=0.6, ls="--")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n for _, n in names], fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("throughput relative to R=1 (labels: per second)")
        ax.set_ylim(0, max(1.3, max((S2[r].get(n) or {}).get("vs_r1") or 0 for r in RS for n, _ in names) * 1.3))
        ax.set_title(f"{SET}, {a.provider} + {a.wire} (unless named), median of {a.rounds}", fontsize=9)
        ax.legend(fontsize=8, loc="upper right")
    if series:
        for k, (prov, r) in enumerate(series.items()):
            segs = r["segments"]
            mid = [(s["start_s"] + s["end_s"]) / 2 for s in segs]
            before = [s["qps"] for s in segs if s["end_s"] <= r["kill_s"]] or [segs[0]["qps"]]
            ref = statistics.mean(before)
            axes[1].plot(mid, [s["qps"] / ref for s in segs], "o-", color=f"C{k}",
                         label=f"{prov} (1.0 = {ref:,.0f} QPS)")
            axes[2].plot(mid, [s["latency_us"]["p99"] / 1e3 if s["latency_us"] else float("nan") for s in segs], "o-",
                         color=f"C{k}", label=prov)
            for ax_ in axes[1:]:
                ax_.axvline(r["kill_s"], color=f"C{k}", ls=":", lw=1)
            for s, m in zip(segs, mid):
                if s["errors"]:
                    axes[1].annotate("no answer (Info failed)" if s.get("start_failed") else f"{s['errors']} failed",
                                     (m, s["qps"] / ref), fontsize=7, color="C3", rotation=30)
        axes[1].set_ylabel("QPS of each 1-s serve-bench run / before the kill")
        axes[1].set_ylim(bottom=0)
        axes[2].set_ylabel("p99 latency, ms (each 1-s run)")
        axes[2].set_yscale("log")  # tcp's p99 is ~10x cxl's
        for ax_ in axes[1:]:
            ax_.set_xlabel("seconds (dotted: SIGKILL of memnode 1 copy 0)")
            ax_.legend(fontsize=8)
            ax_.grid(True, alpha=0.3)
        axes[1].set_title(f"shine serve, R=2, {a.clients} clients: QPS through the kill", fontsize=9)
        axes[2].set_title("p99 through the kill", fontsize=9)
    if rjr:
        ax = grid[1][0]
        labels, vals, fro, cols = [], [], [], []
        for k, (prov, runs) in enumerate(rjr.items()):
            for r in runs:
                x = r["rejoin"]
                labels.append(f"{prov}\n{r['kind']}")
                ok = x.get("ok") and x.get("first_pass_gbytes_per_s") is not None
                vals.append(x["first_pass_gbytes_per_s"] if ok else 0)
                fro.append(f"{x['first_pass_gbytes_per_s']:.2f} GB/s\nfrozen {x['frozen_ms']:.1f} ms" if ok else "FAILED")
                cols.append(f"C{k}")
        bars = ax.bar(range(len(vals)), vals, 0.6, color=cols)
        ax.bar_label(bars, labels=fro, fontsize=7, padding=2)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylim(0, max(vals + [0.1]) * 1.35)
        ax.set_ylabel("rejoin first pass, GB/s (whole region)")
        ax.set_title(f"computenode rejoin of memnode 1 copy 0 ({a.region}) under serve load, {a.wire}", fontsize=9)
        if rser:
            grid[1][2].sharex(grid[1][1])
            for k, (prov, r) in enumerate(rser.items()):
                segs, e = r["segments"], r["events_s"]
                mid = [(s_["start_s"] + s_["end_s"]) / 2 for s_ in segs]
                before = [s_["qps"] for s_ in segs if s_["end_s"] <= e.get("replace_start", 1e9)] or [segs[0]["qps"]]
                ref = statistics.median(before) or 1
                grid[1][1].plot(mid, [s_["qps"] / ref for s_ in segs], "o-", color=f"C{k}",
                                label=f"{prov} (1.0 = {ref:,.0f} QPS)")
                grid[1][2].plot(mid, [s_["latency_us"]["p99"] / 1e3 if s_["latency_us"] else float("nan")
                                      for s_ in segs], "o-", color=f"C{k}", label=prov)
                for ax_ in grid[1][1:]:
                    for ev_ in ("kill1", "kill2"):
                        if ev_ in e:
                            ax_.axvline(e[ev_], color=f"C{k}", ls=":", lw=1.2)
                    if "rejoin_start" in e and "rejoin_end" in e:
                        ax_.axvspan(e["rejoin_start"], e["rejoin_end"], color=f"C{k}", alpha=0.15)
                    if "replace_start" in e:
                        ax_.axvline(e["replace_start"], color=f"C{k}", ls="--", lw=0.8)
                for s_, m in zip(segs, mid):
                    if s_["errors"]:
                        grid[1][1].annotate(f"{s_['errors']} failed", (m, s_["qps"] / ref), fontsize=7, color="C3",
                                            rotation=30)
            grid[1][1].set_ylabel("QPS of each 1-s run / median before the copy")
            grid[1][1].set_ylim(bottom=0)
            grid[1][2].set_ylabel("p99 latency, ms (each 1-s run)")
            grid[1][2].set_yscale("log")
            for ax_ in grid[1][1:]:
                ax_.set_xlabel("s (dotted: kill copy 0, kill copy 1; dashed: new memnode; band: rejoin)", fontsize=8)
                ax_.legend(fontsize=8)
                ax_.grid(True, alpha=0.3)
            grid[1][1].set_title("re-replication: QPS through kill / rejoin / kill", fontsize=9)
            grid[1][2].set_title("p99 through kill / rejoin / kill", fontsize=9)
        else:
            grid[1][1].axis("off")
            grid[1][2].axis("off")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "replication.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE.resolve() else None)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'replication.png'}; logs in {work} "
      f"({results['seconds']:.0f} s)")
