#!/usr/bin/python3
"""Both modes over 2 memnodes beside single-machine hnswlib on the same data and threads.

The data: a shipped set (wordnet, bigann10k), syn100k, or a clustered synthetic set of --n
vectors (syn: datagen, exact ground truth by groundtruth, Faiss flat). hnswlib is built and
queried with T threads (hnswlib-bench); shine is built by one computenode with T threads into
2 memnodes and queried by one computenode with T threads x C coroutines and no cache, without
and with a wire model; d-HNSW is built by dhnsw-build into images of 2 memnodes and queried by
one computenode. Per run: recall@10, QPS, p50/p99, bytes and round trips per query, and the
memory of every process (peak RSS; for a computenode over cxl its own memory apart from the
memnodes' regions it maps). Results: OUT/results.json and OUT/results.md.

  experiments/vs_hnswlib/run.py --set wordnet [--provider cxl] [--wire rdma-100g] [--threads 2]
  experiments/vs_hnswlib/run.py --set syn --n 1000000 --out experiments/scale_1m
"""
import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="wordnet", help="wordnet, bigann10k, syn100k, or syn (--n clustered vectors) "
                "(default %(default)s)")
ap.add_argument("--n", type=int, default=1_000_000, help="syn: base vectors (default %(default)s)")
ap.add_argument("--d", type=int, default=128, help="dimension (default %(default)s)")
ap.add_argument("--clusters", type=int, default=1000, help="datagen mixture components (default %(default)s)")
ap.add_argument("--pool", type=int, default=10000, help="query pool (default %(default)s)")
ap.add_argument("--queries", type=int, default=10000, help="measured queries (default %(default)s)")
ap.add_argument("--m", type=int, default=16, help="HNSW M, all three (default %(default)s)")
ap.add_argument("--ef-construction", type=int, default=100, help="efConstruction, all three (default %(default)s)")
ap.add_argument("--ef-search", default="16,32,64,128", help="efSearch values (default %(default)s)")
ap.add_argument("--threads", type=int, default=2, help="threads of hnswlib, the shine build and the queries "
                "(default %(default)s)")
ap.add_argument("--coroutines", type=int, default=4, help="coroutines per shine query thread (default %(default)s)")
ap.add_argument("--partitions", type=int, default=100, help="d-HNSW partitions (default %(default)s)")
ap.add_argument("--probes", default="2,4", help="d-HNSW partitions searched per query (default %(default)s)")
ap.add_argument("--batch", type=int, default=1000, help="d-HNSW query batch (default %(default)s)")
ap.add_argument("--boundary-ratio", type=float, default=0, help="d-HNSW boundary copies: dhnsw-build --boundary-ratio "
                "(0: none; the index goes to WORK/dhnsw_rR_kK) (default %(default)s)")
ap.add_argument("--probe-ratio", type=float, default=0, help="d-HNSW queries: --probe-ratio (0: every one of the "
                "--probes partitions) (default %(default)s)")
ap.add_argument("--max-copies", type=int, default=8, help="d-HNSW boundary copies: dhnsw-build --max-copies "
                "(default %(default)s)")
ap.add_argument("--provider", default="cxl", help="fabric provider (default %(default)s)")
ap.add_argument("--wire", default="rdma-100g", help="wire model of the second query runs; none: skip them "
                "(default %(default)s)")
ap.add_argument("--region", default="1GiB", help="memnode region for the shine build (default %(default)s)")
ap.add_argument("--read-modes", default="batch", help="shine --read-mode values: batch, per-read, or copy: batch "
                "with --no-in-place (on cxl, batch and per-read read lists and vectors in place) "
                "(default %(default)s)")
ap.add_argument("--work", default=None, help="data, images, logs (default runs/vs_hnswlib/SET)")
ap.add_argument("--out", default=None, help="results.json/results.md (default: this folder's SET/)")
ap.add_argument("--keep-references", action="store_true", help="take hnswlib's and Faiss's results from an earlier "
                "run with the same settings in the work folder instead of building them again")
ap.add_argument("--render-only", action="store_true", help="only write OUT/results.md again from OUT/results.json")
ap.add_argument("--skip", default="", help="comma list of parts to skip: hnswlib, faiss, import, shine, dhnsw; the parts "
                "run replace theirs in an existing OUT/results.json")
a = ap.parse_args()
skip = set(filter(None, a.skip.split(",")))
if a.render_only:
    skip = {"hnswlib", "faiss", "import", "shine", "dhnsw"}
tag = f"syn{a.n // 1000}k" if a.set == "syn" and a.n % 1000 == 0 else (f"syn{a.n}" if a.set == "syn" else a.set)
work = Path(a.work or dmh.ROOT / "runs" / "vs_hnswlib" / tag)
work.mkdir(parents=True, exist_ok=True)
t_start = time.time()
results = {"experiment": "vs_hnswlib", "command": dmh.command_line(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "params": vars(a)}


def status_mib(pid, field):
    """A /proc/PID/status field (kB) in MiB, or None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class PeakMemory:
    """Polls processes' VmHWM (peak RSS) and RssAnon every 0.2 s while they run; the last
    values read are within 0.2 s of their end (VmHWM only grows)."""

    def __init__(self, pids):
        self.pids, self.peak, self.anon = list(pids), {}, {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.2)

    def sample(self):
        for p in self.pids:
            hwm, anon = status_mib(p, "VmHWM"), status_mib(p, "RssAnon")
            if hwm is not None:
                self.peak[p] = max(self.peak.get(p, 0), hwm)
            if anon is not None:
                self.anon[p] = max(self.anon.get(p, 0), anon)

    def stop(self):
        self.sample()
        self._stop.set()
        self._t.join()
        return [{"peak_rss_mib": self.peak.get(p), "peak_anon_mib": self.anon.get(p)} for p in self.pids]


def timed(cmd, log, env=None):
    """Runs CMD (output to LOG); returns (seconds, peak memory of the process)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        f.write(" ".join(map(str, cmd)) + "\n")
        f.flush()
        p = subprocess.Popen([str(x) for x in cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
        mem = PeakMemory([p.pid])
        rc = p.wait()
        m = mem.stop()[0]
    if rc != 0:
        raise RuntimeError(f"{cmd[0]} failed ({rc}); see {log}")
    return time.time() - t0, m


def memnode_memory(mn):
    return [{"peak_rss_mib": status_mib(p.pid, "VmHWM"), "rss_anon_mib": status_mib(p.pid, "RssAnon"),
             "rss_shmem_mib": status_mib(p.pid, "RssShmem")} for p in mn.procs]


def run_summary(r):
    """The numbers of one query run (both modes' reports share these fields)."""
    pq, lat = r["per_query"], r["latency_us"]
    return {"ef_search": r["ef_search"], "recall": r["recall"], "qps": r["qps"], "p50_us": lat.get("p50"),
            "p99_us": lat.get("p99"), "bytes_per_query": pq.get("bytes"), "reads_per_query": pq.get("reads"),
            "doorbells_per_query": pq.get("doorbells")}


# ---- data: a shipped set, or N clustered vectors with a query pool from the same mixture, exact top-100
metric = "l2"
if a.set == "syn":
    base, pool, gt = work / "base.fvecs", work / "query.fvecs", work / "gt.ivecs"
else:
    base, pool, gt, metric = dmh.dataset_files(a.set, dmh.SHINE_WORK)
    with open(base, "rb") as fh:
        a.d = int.from_bytes(fh.read(4), "little")
    a.n = (base.stat().st_size // (4 + a.d * (1 if base.suffix == ".bvecs" else 4)))
wl = work / "uniform.wl"
if not gt.exists():
    dmh.log(f"datagen {a.n} x {a.d}, {a.clusters} clusters; groundtruth of {a.pool} queries")
    t0 = time.time()
    dmh.run([dmh.BIN / "datagen", "--n", a.n, "--d", a.d, "--clusters", a.clusters, "--spread", 0.6, "--seed", 21,
             "--queries", a.pool, "--out-base", base, "--out-queries", pool])
    results["datagen_s"] = time.time() - t0
    t0 = time.time()
    tmp = gt.with_name("gt.tmp.ivecs")
    dmh.run([dmh.BIN / "groundtruth", "--base", base, "--queries", pool, "--k", 100, "--metric", "l2", "--out", tmp])
    tmp.replace(gt)
    results["groundtruth_s"] = time.time() - t0
if not wl.exists():
    dmh.run([dmh.BIN / "workload", "--queries", pool, "--groundtruth", gt, "--dist", "uniform", "--count", a.queries,
             "--warmup", 500, "--seed", 5, "--out", wl])

# ---- the single-machine references: hnswlib, and Faiss IndexHNSWFlat (same M, efConstruction, threads)
def reference(name, tool, extra):
    """Builds and queries with TOOL (hnswlib-bench or faiss-bench) on the same data and workload;
    with --keep-references, takes the results a run with the same settings left in the work folder."""
    kept = work / f"{name}_result.json"
    settings = {k: getattr(a, k) for k in ("set", "n", "d", "clusters", "queries", "m", "ef_construction",
                                            "ef_search", "threads")}
    load = None
    if a.keep_references and kept.exists():
        prior = json.loads(kept.read_text())
        if prior.get("settings") == settings:
            dmh.log(f"{tool}: the results in {kept} (--keep-references)")
            results[name] = prior["results"]
            return
        same_index = {k: v for k, v in prior.get("settings", {}).items() if k != "ef_search"} == \
            {k: v for k, v in settings.items() if k != "ef_search"}
        if name == "hnswlib" and same_index and (work / "hnswlib.idx").exists():
            # Only efSearch differs: the saved index is searched again, its build kept.
            load = prior["results"]
            extra = ["--load", work / "hnswlib.idx"]
            dmh.log(f"{tool}: searching {work / 'hnswlib.idx'} again (--keep-references; build from {kept})")
        else:
            dmh.log(f"{tool}: {kept} was made with other settings; run again")
    dmh.log(tool)
    rj = work / f"{name}.json"
    secs, mem = timed([dmh.BIN / tool, "--base", base, "--workload", wl, "--metric", metric, "--m", a.m,
                       "--ef-construction", a.ef_construction, "--ef-search", a.ef_search, "--k", 10,
                       "--threads", a.threads, "--json", rj] + extra, work / "logs" / f"{name}.log", env=dmh.reference_env())
    r = json.loads(rj.read_text())
    results[name] = {"build_s": r["build_seconds"], "inserts_per_s": a.n / max(r["build_seconds"], 1e-9), "memory": mem,
                     "runs": [{"ef_search": x["ef_search"], "recall": x["recall"], "qps": x["qps"],
                               "p50_us": x["latency_us"]["p50"], "p99_us": x["latency_us"]["p99"]} for x in r["runs"]]}
    if load is not None:  # the build's time and memory, from the run that built it
        results[name].update({k: load[k] for k in ("build_s", "inserts_per_s", "memory")})
    tmp = kept.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": settings, "results": results[name]}, indent=2) + "\n")
    tmp.rename(kept)


if "hnswlib" not in skip:
    reference("hnswlib", "hnswlib-bench", ["--save", work / "hnswlib.idx"])
if "faiss" not in skip:
    reference("faiss", "faiss-bench", ["--index", "hnsw-flat"])

common = ["--workload", wl, "--k", 10, "--ef-search", a.ef_search, "--threads", a.threads]

# ---- shine-import: hnswlib's own graph served by 2 memnodes, queried by a computenode
if "import" not in skip and (work / "hnswlib.idx").exists():
    dmh.log(f"shine-import of hnswlib's index into 2 memnodes ({a.provider})")
    im = {}
    with dmh.Memnodes(2, a.provider, a.region, work / "import_mn") as mn:
        ij = work / "import.json"
        secs, mem = timed([dmh.BIN / "shine-import", "--hnswlib", work / "hnswlib.idx", "--metric", metric,
                           "--data", base, "--memnodes", mn.list, "--provider", a.provider, "--report", ij],
                          work / "logs" / "import.log")
        im["import"] = {"process_s": secs, "memory": mem, "report": json.loads(ij.read_text())}
        q = dmh.computenodes(mn, a.provider, 1, "query", common + ["--coroutines", a.coroutines],
                             work / "import_query.json", logdir=work / "logs" / "import_query", timeout=3600)[0]
        im["query_batch_none"] = {"runs": [run_summary(r) for r in q["runs"]],
                                  "computenode_memory": q.get("process_memory")}
    results["import"] = im

# ---- shine: one global graph over 2 memnodes
if "shine" not in skip:
    dmh.log(f"shine build over 2 memnodes ({a.provider})")
    sh = {}
    with dmh.Memnodes(2, a.provider, a.region, work / "shine_mn") as mn:
        t0 = time.time()
        build = dmh.computenodes(mn, a.provider, 1, "build",
                                 ["--data", base, "--m", a.m, "--ef-construction", a.ef_construction, "--metric", metric,
                                  "--threads", a.threads], work / "shine_build.json", logdir=work / "logs" / "shine_build",
                                 timeout=6 * 3600)[0]
        sh["build"] = {"seconds": build["seconds"], "inserts_per_s": build["inserts_per_s"], "wall_s": time.time() - t0,
                       "computenode_memory": build.get("process_memory"), "io": build.get("io"),
                       "memnode_bytes_used": sum(u.get("bytes_used", 0) for u in build.get("memnode_usage", []))}
        sh["memnode_memory_after_build"] = memnode_memory(mn)
        for mode, wire in [(m, w) for m in a.read_modes.split(",")
                           for w in ["none"] + ([a.wire] if a.wire != "none" else [])]:
            dmh.log(f"shine query, --read-mode {mode}, wire {wire}")
            how = ["--read-mode", "batch", "--no-in-place"] if mode == "copy" else ["--read-mode", mode]
            q = dmh.computenodes(mn, a.provider, 1, "query", common + ["--coroutines", a.coroutines] + how,
                                 work / f"shine_query_{mode}_{wire}.json",
                                 logdir=work / "logs" / f"shine_query_{mode}_{wire}", timeout=3600, wire=wire)[0]
            sh[f"query_{mode}_{wire}"] = {"runs": [run_summary(r) for r in q["runs"]],
                                   "computenode_memory": q.get("process_memory"), "memnode_cpu": q.get("memnode_cpu")}
        sh["memnode_memory"] = memnode_memory(mn)
    results["shine"] = sh

# ---- d-HNSW: balanced partitions, sub-HNSWs stored contiguously on 2 memnodes
if "dhnsw" not in skip:
    ddir = work / ("dhnsw" if a.boundary_ratio == 0 else f"dhnsw_r{a.boundary_ratio:g}_k{a.max_copies}")
    img = ddir / "index.img"
    dj = ddir / "build.json"
    dh = {}
    if not dj.exists():
        dmh.log(f"dhnsw-build, {a.partitions} partitions over 2 memnodes")
        img.parent.mkdir(parents=True, exist_ok=True)
        tmp = dj.with_name("build.json.tmp")
        secs, mem = timed([dmh.BIN / "dhnsw-build", "--data", base, "--metric", metric, "--partitions", a.partitions,
                           "--m", a.m, "--ef-construction", a.ef_construction, "--memnodes", 2, "--threads", a.threads,
                           "--boundary-ratio", a.boundary_ratio, "--max-copies", a.max_copies,
                           "--out", img, "--json", tmp], work / "logs" / "dhnsw_build.log")
        tmp.replace(dj)
        (ddir / "build_memory.json").write_text(json.dumps({"seconds": secs, "memory": mem}) + "\n")
    b = json.loads(dj.read_text())
    bm = json.loads((ddir / "build_memory.json").read_text())
    dh["build"] = {"seconds": bm["seconds"], "inserts_per_s": a.n / bm["seconds"], "memory": bm["memory"],
                   "report": {k: b[k] for k in ("partitions", "seconds", "boundary", "layout") if k in b}}
    images = [img.with_name(f"index.img.{i}") for i in range(2)]
    with dmh.Memnodes(None, a.provider, a.region, ddir.with_name(ddir.name + "_mn"), load=images) as mn:
        for probe in [int(x) for x in a.probes.split(",")]:
            for wire in ["none"] + ([a.wire] if a.wire != "none" else []):
                dmh.log(f"dhnsw query, b={probe}, wire {wire}")
                q = dmh.computenodes(mn, a.provider, 1, "query",
                                     ["--workload", wl, "--k", 10, "--ef-search", a.ef_search, "--batch", a.batch,
                                      "--probe", probe, "--probe-ratio", a.probe_ratio],
                                     work / f"dhnsw_query_b{probe}_{wire}.json",
                                     logdir=work / "logs" / f"dhnsw_query_b{probe}_{wire}", timeout=3600,
                                     mode="dhnsw", wire=wire)[0]
                dh[f"query_b{probe}_{wire}"] = {"runs": [dict(run_summary(r), partitions=r["per_query"].get("partitions"))
                                                         for r in q["runs"]],
                                                "computenode_memory": q.get("process_memory"),
                                                "memnode_cpu": q.get("memnode_cpu")}
        dh["memnode_memory"] = memnode_memory(mn)
    results["dhnsw"] = dh

results["seconds"] = time.time() - t_start
out = Path(a.out or HERE / tag)
out.mkdir(parents=True, exist_ok=True)
if a.render_only:
    results = json.loads((out / "results.json").read_text())
    # The header describes the runs (a partial run's flags last), not this call.
    for params in [results["params"]] + [p.get("params", {}) for p in results.get("partial_runs", [])]:
        for k, v in params.items():
            if k not in ("render_only", "out"):
                setattr(a, k, v)
elif skip and (out / "results.json").exists():  # a partial run: the other parts stay as they were
    merged = json.loads((out / "results.json").read_text())
    for k, v in results.items():  # a system's runs of other settings (e.g. another b or wire) stay
        if k in ("params", "command", "date"):
            continue
        merged[k] = {**merged[k], **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    merged.setdefault("partial_runs", []).append({"command": results["command"], "date": results["date"],
                                                  "params": results["params"]})
    merged["seconds"] = results["seconds"] + merged.get("full_seconds", 0)
    results = merged
else:
    results["full_seconds"] = results["seconds"]
if not a.render_only:
    (out / "results.json.tmp").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.json.tmp").replace(out / "results.json")


# ---- results.md: one table of query runs, one of builds and memory
def f(x, fmt="{:,.0f}"):
    return "–" if x is None else fmt.format(x)


def query_row(system, fabric, r, per_query="{:.0f}"):
    """A row of the query table; `per_query` formats READs and round trips per query."""
    return [system, fabric, r["ef_search"], f(r["recall"], "{:.4f}"), f(r["qps"]), f(r["p50_us"]), f(r["p99_us"]),
            f((r["bytes_per_query"] or 0) / 1024, "{:.1f}"), f(r["reads_per_query"], per_query),
            f(r["doorbells_per_query"], per_query)]


rows = []
for ref, label in (("hnswlib", "hnswlib"), ("faiss", "Faiss IndexHNSWFlat")):
    for r in results.get(ref, {}).get("runs", []):
        rows.append([label, "local", r["ef_search"], f(r["recall"], "{:.4f}"), f(r["qps"]), f(r["p50_us"]),
                     f(r["p99_us"]), "–", "–", "–"])
for key in [k for k in results.get("shine", {}) if k.startswith("query_")]:
    mode, wire = key[len("query_"):].split("_", 1)
    rows += [query_row(f"shine ({mode})", f"{a.provider}, wire {wire}", r) for r in results["shine"][key]["runs"]]
rows += [query_row("shine (hnswlib's graph, shine-import)", f"{a.provider}, wire none", r)
         for r in results.get("import", {}).get("query_batch_none", {}).get("runs", [])]
for key in [k for k in results.get("dhnsw", {}) if k.startswith("query_")]:
    probe, wire = key[len("query_"):].split("_", 1)
    rows += [query_row(f"dhnsw {probe.replace('b', 'b=')}" +
                       (f" (ratio {a.probe_ratio:g}: {r['partitions']:.2f} searched)" if a.probe_ratio else ""),
                       f"{a.provider}, wire {wire}", r, "{:.1f}")
             for r in results["dhnsw"][key]["runs"]]
bnd = results.get("dhnsw", {}).get("build", {}).get("report", {}).get("boundary", {})
boundary = (f"; boundary copies: ratio {bnd['ratio']:g}, at most {bnd['max_copies']} partitions per vector, "
            f"{bnd['partitions_per_vector']:.2f} on average, {bnd['copy_bytes'] / 2**20:.1f} MiB"
            if bnd.get("copies") else "")
what = f"{a.n:,} x {a.d} clustered vectors ({a.clusters} clusters)" if a.set == "syn" else f"{a.set} ({a.n:,} x {a.d}, {metric})"
later = "".join(f", then {p['date']}: `{p['command']}`" for p in results.get("partial_runs", []))
md = [f"Run {results['date']} ({results['seconds'] / 60:.0f} min): `{results['command']}`{later}\n\n"
      f"{what}, {a.queries:,} uniform queries, k=10, "
      f"M={a.m}, efConstruction={a.ef_construction}, {a.threads} threads everywhere; shine and d-HNSW over 2 "
      f"memnodes ({a.provider}), 1 computenode (shine: {a.threads} threads x {a.coroutines} coroutines, no cache; "
      f"d-HNSW: P={a.partitions}, batch {a.batch}{boundary}).\n",
      dmh.md_table(["system", "fabric", "efSearch", "recall@10", "QPS", "p50 us", "p99 us", "KiB/query",
                    "READs/query", "round trips/query"], rows)]
brow = []
if "hnswlib" in results:
    h = results["hnswlib"]
    brow.append(["hnswlib", f(h["build_s"], "{:.0f}"), f(h["inserts_per_s"]), "1.00",
                 f(h["memory"]["peak_rss_mib"]), "–"])
if "faiss" in results:
    fz = results["faiss"]
    brow.append(["Faiss IndexHNSWFlat", f(fz["build_s"], "{:.0f}"), f(fz["inserts_per_s"]),
                 f(fz["inserts_per_s"] / results["hnswlib"]["inserts_per_s"], "{:.2f}") if "hnswlib" in results else "–",
                 f(fz["memory"]["peak_rss_mib"]), "–"])
hn = results.get("hnswlib", {}).get("inserts_per_s")


def build_row(name, b, builder, memnodes):
    """A row of the builds table: seconds, inserts/s and its ratio to hnswlib's."""
    return [name, f(b["seconds"], "{:.0f}"), f(b["inserts_per_s"]),
            f(b["inserts_per_s"] / hn, "{:.2f}") if hn else "–", builder,
            " + ".join(f(m["peak_rss_mib"]) for m in memnodes)]


if "shine" in results:
    s = results["shine"]
    cm = s["build"].get("computenode_memory") or {}
    brow.append(build_row("shine", s["build"],
                          f"computenode {f(cm.get('peak_rss_mib'))} (of which {f(cm.get('shmem_mib'))} the mapped regions)",
                          s["memnode_memory"]))
if "dhnsw" in results:
    d = results["dhnsw"]
    brow.append(build_row("d-HNSW (dhnsw-build)", d["build"], f"dhnsw-build {f(d['build']['memory']['peak_rss_mib'])}",
                          d["memnode_memory"]))
if "import" in results:
    ir = results["import"]["import"]
    brow.append(["shine-import of hnswlib's index", f(ir["process_s"], "{:.1f}"), "–", "–",
                 f"shine-import {f(ir['memory']['peak_rss_mib'])}", "–"])
md += ["\nBuilds and memory (peak RSS, MiB):\n\n",
       dmh.md_table(["index", "build s", "inserts/s", "vs hnswlib", "builder memory", "memnodes (peak RSS)"], brow)]
qmem = []
for sys_, part in (("shine", results.get("shine", {})), ("dhnsw", results.get("dhnsw", {}))):
    for key, v in part.items():
        if key.startswith("query_") and v.get("computenode_memory"):
            m = v["computenode_memory"]
            qmem.append([sys_, key[len("query_"):], f(m.get("peak_rss_mib")), f(m.get("anon_mib")),
                         f(m.get("shmem_mib")), f(m.get("hugetlb_mib"))])
for ref, label in (("hnswlib", "hnswlib"), ("faiss", "Faiss IndexHNSWFlat")):
    if ref in results:
        qmem.append([label, "build + queries", f(results[ref]["memory"]["peak_rss_mib"]),
                     f(results[ref]["memory"]["peak_anon_mib"]), "–", "–"])
md += ["\nQuerying processes (MiB; a cxl computenode maps the memnodes' regions, counted as shared, not its own):\n\n",
       dmh.md_table(["system", "run", "peak RSS", "own (anon)", "mapped (shmem)", "mapped (hugetlb)"], qmem)]
(out / "results.md").write_text("".join(md))
print("".join(md))
dmh.log(f"wrote {out / 'results.md'} ({(time.time() - t_start) / 60:.0f} min)")
