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

Every process started here is stopped at the end, also on errors. Binaries come from --bin
(copy build/bin first when it is being rebuilt: `cp -a build/bin /tmp/repl-bin`).

  experiments/replication/run.py [--bin build/bin] [--rounds 3] [--failover-providers cxl,tcp] [--quick]
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
ap.add_argument("--timeout", type=float, default=180, help="seconds one computenode run may take (default %(default)s)")
ap.add_argument("--quick", action="store_true", help="smoke run (about a minute): 1 round of R=1,2, 1-s queries, "
                "failover over cxl only, 4-s serve runs (kill at 1.5 s); results go to WORK/quick/")
a = ap.parse_args()
if a.quick:
    a.replicas, a.rounds, a.query_seconds, a.dhnsw_queries = "1,2", 1, 1, 5000
    a.failover_providers, a.failover_repeats, a.serve_seconds, a.kill_at = "cxl", 1, 4, 1.5
    a.image_query_count = 100
    a.timeout = min(a.timeout, 90)

dmh.BIN = Path(a.bin).resolve()
BIN = dmh.BIN
work = Path(a.work).resolve() / ("quick" if a.quick else "full")
work.mkdir(parents=True, exist_ok=True)
out = Path(a.out) if a.out else (Path(a.work).resolve() / "quick" if a.quick else HERE)
RS = [int(x) for x in a.replicas.split(",")]
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
        return out

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            stop(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cn_cmd(mn, mode, provider, sub, args):
    return [BIN / "computenode", "--mode", mode, "--provider", provider, "--wire", a.wire, "--memnodes", mn.list,
            "--cn-id", 0, "--num-cns", 1, sub] + list(args)


def computenode(mn, mode, provider, sub, args, report, log):
    """One computenode run; returns its JSON report, plus process_cpu_s: the process's CPU time
    (user + system, from the rusage of the children reaped meanwhile: only this one)."""
    Path(report).unlink(missing_ok=True)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = spawn(cn_cmd(mn, mode, provider, sub, list(args) + ["--report", report]), log)
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


base, _, _, metric = dmh.dataset_files(SET, work)
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
    """Fresh R-copy memnodes: d-HNSW build of 8,000 rows, insert of the other 2,000, query."""
    d = work / "throughput" / tag / "dhnsw"
    def go(k):
        with Cluster(a.memnode_ids, r, a.provider, a.region, d / f"mn{k}") as mn:
            b = computenode(mn, "dhnsw", a.provider, "build", ["--data", base, "--metric", metric, "--max-elements", 8000],
                            d / "build.json", d / "build.log")
            i = computenode(mn, "dhnsw", a.provider, "insert", ["--data", base, "--begin", 8000],
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


# ---- 1-3: throughput for every R, interleaved
try:
    for rnd in range(a.rounds):
        order = RS[rnd % len(RS):] + RS[:rnd % len(RS)]
        row = {}
        for r in order:
            t0 = time.time()
            load0 = os.getloadavg()[0]
            s = shine_trial(r, f"round{rnd}-R{r}")
            h = dhnsw_trial(r, f"round{rnd}-R{r}")
            row[r] = {"shine": s, "dhnsw": h, "loadavg_before": load0, "wall_s": time.time() - t0}
            dmh.log(f"round {rnd} R={r}: shine build {s['build_inserts_per_s']:.0f}/s, query {s['query_qps']:.0f} QPS "
                    f"(recall {s['query_recall']:.4f}, {s['query_per_query']['reads']:.0f} READs/q); d-HNSW insert "
                    f"{h['insert_inserts_per_s']:.0f}/s, query {h['query_qps']:.0f} QPS (recall {h['query_recall']:.4f}) "
                    f"[load {load0:.1f}, {time.time() - t0:.0f} s]")
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
    summary = {}
    for r in RS:
        summary[r] = {}
        for name, path in METRICS.items():
            m, vals = med(path, r)
            summary[r][name] = {"median": m, "all": vals}
        last = results["throughput"]["rounds"][-1][r]
        summary[r]["shine_per_query"] = last["shine"]["query_per_query"]
        summary[r]["dhnsw_per_query"] = last["dhnsw"]["query_per_query"]
        summary[r]["shine_build_io_per_insert"] = last["shine"]["build_io_per_insert"]
        summary[r]["dhnsw_per_insert"] = last["dhnsw"]["insert_per_insert"]
    # vs R=1: the median over rounds of R's value over R=1's in the same round (the runs of a round
    # are minutes apart at most, so the paired ratio is less exposed to the host's drifting load)
    for r in RS:
        for name in ("shine_build", "shine_query", "dhnsw_insert", "dhnsw_query", "shine_build_cpu_us",
                     "shine_query_cpu_us", "dhnsw_insert_cpu_us", "dhnsw_query_cpu_us"):
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
                    segs, t0 = [], time.time()
                    th = threading.Thread(target=killer, args=(t0,))
                    th.start()
                    try:
                        for k in range(int(round(a.serve_seconds))):
                            ts = time.time()
                            p = bench(addr, 1, d / f"seg{k}.json", d / f"seg{k}.log", warmup=100 if k == 0 else 0)
                            s = bench_result(p, d / f"seg{k}.json", d / f"seg{k}.log", start_may_fail=True)
                            if s.get("start_failed"):
                                time.sleep(max(0.0, ts + 1 - time.time()))  # keep the time axis
                            te = time.time()
                            s.update({"start_s": ts - t0, "end_s": te - t0})
                            segs.append(s)
                    finally:
                        th.join()
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

    provs = [p for p in a.failover_providers.split(",") if p]
    iprovs = [p for p in a.image_query_providers.split(",") if p]
    if provs or iprovs:
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
    def image_query(provider, r, tag):
        d = work / "image_query" / provider / tag
        def go(k):
            with Cluster(a.memnode_ids, r, provider, a.region, d / f"mn{k}", load=images) as mn:
                return computenode(mn, "shine", provider, "query",
                                   ["--workload", wl_small, "--k", 10, "--ef-search", 64, "--threads", 2,
                                    "--coroutines", 4, "--cache-ratio", 0],  # one pass: --repeat-seconds S queues
                                   # S seconds of queries, which a slow transport answers for much longer
                                   d / "query.json", d / "query.log")
        q = retried(go, f"{provider} {tag} query", d)
        run = q["runs"][0]
        mcpu = q.get("memnode_cpu") or {}
        return {"qps": run["qps"], "recall": run["recall"], "per_query": run["per_query"], "queries": run["queries"],
                "latency_us": run["latency_us"],
                "cpu_us_per_query": sum(c["cpu_seconds"] for c in run["per_cn"]) * 1e6 / max(1, run["queries"]),
                "memnode_cpu_us_per_query": sum(mcpu.get("seconds", [])) * 1e6 / max(1, run["queries"]),
                "memnode_cores": sum(mcpu.get("seconds", [])) / mcpu["wall_s"] if mcpu.get("wall_s") else None}
    IRS = [r for r in RS if r <= 2] if 2 in RS else RS
    for prov in iprovs:
        rounds = []
        for rnd in range(a.rounds):
            order = IRS[rnd % len(IRS):] + IRS[:rnd % len(IRS)]
            row = {}
            for r in order:
                t0 = time.time()
                row[r] = image_query(prov, r, f"round{rnd}-R{r}")
                x = row[r]
                dmh.log(f"{prov} query round {rnd} R={r}: {x['qps']:.0f} QPS (recall {x['recall']:.4f}), computenode "
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
        results.setdefault("image_query", {})[prov] = {"rounds": rounds, "summary": summ}

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
finally:
    stop_all()

# ---- results
results["seconds"] = time.time() - t_start
results["retries"] = RETRIES
checks = []
S = results["throughput"]["summary"]
if 1 in RS:
    for r in RS[1:]:
        if r == 2:
            checks.append({"what": "shine build inserts/s, R=2 >= 0.7x R=1", "value": f"{S[2]['shine_build']['vs_r1']:.2f}x",
                           "ok": S[2]["shine_build"]["vs_r1"] >= 0.7})
            for n, lab in (("shine_query", "shine query QPS"), ("dhnsw_query", "d-HNSW query QPS")):
                checks.append({"what": f"{lab}, R=2 >= 1.0x R=1", "value": f"{S[2][n]['vs_r1']:.2f}x",
                               "ok": S[2][n]["vs_r1"] >= 1.0})
for prov, x in results.get("image_query", {}).items():
    if 2 in x["summary"] and x["summary"][2]["qps"]["vs_r1"] is not None:
        v = x["summary"][2]["qps"]["vs_r1"]
        checks.append({"what": f"shine query QPS over {prov}, R=2 >= 1.0x R=1", "value": f"{v:.2f}x", "ok": v >= 1.0})
for prov, runs in results["failover"].items():
    if isinstance(runs, list):
        n = sum(r["errors"] for r in runs if r["kind"] != "baseline")
        checks.append({"what": f"failed requests through a copy's SIGKILL ({prov})", "value": str(n), "ok": n == 0})
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
results["binaries_after"] = dmh.binaries_identity(("computenode", "memnode", "serve-bench"))
results["binaries_changed"] = sorted(k for k in results["binaries_after"]
                                     if results["binaries"].get(k) != results["binaries_after"][k])

f0 = lambda x: f"{x:,.0f}"  # noqa: E731
md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min, host with {os.cpu_count()} cores): "
      f"`{results['command']}`\n\n"
      f"{SET}, {a.memnode_ids} memnode ids x R copies over `{a.provider}` with `--wire {a.wire}`, one computenode; "
      f"median of {a.rounds} round(s) (R order rotated each round; every round's value in brackets); vs R=1: the "
      f"median over the rounds of the ratio to R=1 in the same round.\n\n"]
hdr = ["R", "memnode processes", "shine build inserts/s", "vs R=1", "d-HNSW insert inserts/s", "vs R=1",
       "shine query QPS", "vs R=1", "d-HNSW query QPS", "vs R=1"]
rows = []
for r in RS:
    s = S[r]
    cell = lambda n: f"**{f0(s[n]['median'])}** ({' / '.join(f0(v) for v in s[n]['all'])})"  # noqa: E731
    vs = lambda n: "—" if s[n]["vs_r1"] is None else f"{s[n]['vs_r1']:.2f}x"  # noqa: E731
    rows.append([r, r * a.memnode_ids, cell("shine_build"), vs("shine_build"), cell("dhnsw_insert"), vs("dhnsw_insert"),
                 cell("shine_query"), vs("shine_query"), cell("dhnsw_query"), vs("dhnsw_query")])
md.append(dmh.md_table(hdr, rows))
md.append("\nCPU time of the computenode per operation (the resource that binds on this host; shine query: the "
          "measured phase, from its report; the others: the whole process, from its rusage, so including start-up, "
          "reading the data and, for the d-HNSW query, 1,000 warm-up queries), median, and vs R=1 as above:\n\n")
rows = []
for r in RS:
    s = S[r]
    cpu = lambda n: f"**{s[n]['median']:.0f}**" + ("" if s[n]["vs_r1"] is None else f" ({s[n]['vs_r1']:.2f}x)")  # noqa: E731
    rows.append([r, cpu("shine_build_cpu_us"), cpu("dhnsw_insert_cpu_us"), cpu("shine_query_cpu_us"),
                 cpu("dhnsw_query_cpu_us")])
md.append(dmh.md_table(["R", "shine build µs/insert", "d-HNSW insert µs/insert", "shine query µs/query",
                        "d-HNSW query µs/query"], rows))
md.append("\nPer operation (last round): shine build I/O per insert, query READs / doorbells / KiB per query "
          "(the computenode's logical operations: a WRITE to R copies counts once), recall@10 (median):\n\n")
rows = []
for r in RS:
    s = S[r]
    bi, sq, dq, di = s["shine_build_io_per_insert"], s["shine_per_query"], s["dhnsw_per_query"], s["dhnsw_per_insert"]
    rows.append([r, f"{bi['reads']:.0f} / {bi['writes']:.1f} / {bi['atomics']:.1f} / {bi['bytes'] / 1024:.1f}",
                 f"{sq['reads']:.0f} / {sq['doorbells']:.0f} / {sq['bytes'] / 1024:.0f}",
                 f"{s['shine_recall']['median']:.4f}",
                 f"{di['writes']:.2f} / {di['bytes_written']:.0f}",
                 f"{dq['reads']:.3f} / {dq['bytes'] / 1024:.1f}", f"{s['dhnsw_recall']['median']:.4f}"])
md.append(dmh.md_table(["R", "shine build: READs / WRITEs / atomics / KiB per insert",
                        "shine query: READs / doorbells / KiB", "shine recall@10",
                        "d-HNSW insert: WRITEs / bytes per insert", "d-HNSW query: READs / KiB", "d-HNSW recall@10"],
                       rows))
for prov, x in results.get("image_query", {}).items():
    md.append(f"\nShine query over `{prov}` (`--wire {a.wire}`), the index loaded from images (built once over cxl), "
              f"one pass of {a.image_query_count} measured queries (30 warm-up), median of {a.rounds} round(s); "
              f"CPU time per query of the computenode and of all memnodes together:\n\n")
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
if RETRIES:
    md.append(f"\nRetried after a failure with fresh processes: " + "; ".join(
        f"{x['what']} ({x['why']})" for x in RETRIES) + " (`retries` in results.json).\n")
foreign = [(p_, r["kind"], r["foreign_stops"]) for p_, runs in fo.items() for r in runs if r.get("foreign_stops")]
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
    ncol = 1 + (2 if series else 0)
    fig, axes = plt.subplots(1, ncol, figsize=(5.2 * ncol, 4.2))
    axes = list(axes) if ncol > 1 else [axes]
    if series:
        axes[2].sharex(axes[1])
    ax = axes[0]
    names = [("shine_build", "shine build"), ("dhnsw_insert", "d-HNSW insert"), ("shine_query", "shine query"),
             ("dhnsw_query", "d-HNSW query")]
    S2 = {r: dict(S[r]) for r in RS}
    for prov, x in results.get("image_query", {}).items():
        names.append((f"iq_{prov}", f"shine query\n({prov})"))
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
    ax.set_xticklabels([n for _, n in names], fontsize=8)
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
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "replication.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE.resolve() else None)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'replication.png'}; logs in {work} "
      f"({results['seconds']:.0f} s)")
