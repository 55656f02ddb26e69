#!/usr/bin/python3
"""d-HNSW ablation: per-query latency as the optimisations are enabled one after the other,
like Figure 14 of the d-HNSW paper (see README.md here).

On syn100k (100K x 128, l2), for each number of partitions P (partition size 100K/P: the
ratio that matters is fetching + deserializing a partition against searching it for one
query): one memnode serves the index, one computenode runs probe b=2, efSearch 32, batch
1000 in four configurations:
  naive              --no-regroup --no-doorbell --no-pipeline  (each query fetches its own b partitions)
  +regroup           --no-doorbell --no-pipeline               (each needed partition once per batch, LRU cache)
  +regroup+doorbell  --no-pipeline                             (several fetches per doorbell)
  full               (pipelined fetch / deserialize / search)
Per-query latency = stages_us.pipelined_total (the run's wall time per query). Every
configuration runs REPEATS times (median). Criterion: naive / full >= 50 (the paper: 117-430x).

  experiments/dhnsw_ablation/run.py [--partitions 4,8,16] [--queries 10000] [--warmup 2000]
      [--naive-queries 200] [--repeats 3] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = [("naive", dict(regroup=False, doorbell=False, pipeline=False)),
           ("+regroup", dict(doorbell=False, pipeline=False)),
           ("+regroup+doorbell", dict(pipeline=False)),
           ("full", {})]
LABEL = {"naive": "naive", "+regroup": "+ regroup", "+regroup+doorbell": "+ regroup + doorbell",
         "full": "+ regroup + doorbell + pipeline"}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="syn100k", help="data set (default %(default)s)")
ap.add_argument("--partitions", default="4,8,16", help="P values (default %(default)s)")
ap.add_argument("--probe", type=int, default=2, help="b (default %(default)s)")
ap.add_argument("--ef-search", type=int, default=32, help="efSearch (default %(default)s)")
ap.add_argument("--batch", type=int, default=1000, help="B (default %(default)s)")
ap.add_argument("--queries", type=int, default=10000, help="measured queries of the regrouped configurations (default %(default)s)")
ap.add_argument("--warmup", type=int, default=2000, help="their warm-up queries (default %(default)s)")
ap.add_argument("--naive-queries", type=int, default=200, help="measured queries of naive, no warm-up (default %(default)s)")
ap.add_argument("--repeats", type=int, default=3, help="runs per configuration, median latency (default %(default)s)")
ap.add_argument("--min-ratio", type=float, default=50, help="criterion: naive / full >= R (default %(default)s)")
dmh.dhnsw_common_args(ap, quick_help="smoke run: P=16, 1000 + 200 warm-up queries, naive 50, 1 run each; results "
                                     "go to WORK/quick/dhnsw_ablation/")
a = ap.parse_args()
if a.quick:
    a.partitions, a.queries, a.warmup, a.naive_queries, a.repeats = "16", 1000, 200, 50, 1
    a.timeout = min(a.timeout, 300)

work, out, t_start, results = dmh.dhnsw_start("dhnsw_ablation", a, HERE)
Ps = [int(x) for x in a.partitions.split(",")]
wl = dmh.shine_workload(a.set, dmh.SHINE_WORK, "uniform", a.queries, a.warmup, a.seed)
wl_naive = dmh.shine_workload(a.set, dmh.SHINE_WORK, "uniform", a.naive_queries, 0, a.seed)
results["partitions"] = {}
dmh.log(f"dhnsw_ablation: {a.set}, P {Ps}, b={a.probe}, efSearch {a.ef_search}, batch {a.batch}, {a.repeats} run(s) each")
for P in Ps:
    images = dmh.dhnsw_index(a.set, a.work, P, a.m, a.ef_construction)
    info = dmh.dhnsw_index_info(images)
    res = {"partition_vectors": info["partitions"]["mean"], "index_dir": str(images[0].parent), "configs": {}}
    for name, flags in CONFIGS:
        t0 = time.time()
        w = wl_naive if name == "naive" else wl
        r = dmh.dhnsw_measure(images, w, work / "ablation" / f"p{P}" / name.strip("+").replace("+", "_"), a.repeats,
                              batch=a.batch, probe=a.probe, ef_search=a.ef_search, provider=a.provider, wire=a.wire,
                              region=a.region, timeout=a.timeout, **flags)
        res["configs"][name] = r
        dmh.log(f"  P={P} {name}: {r['total_us']:.1f} us/query (all {[round(x, 1) for x in r['total_us_all']]}), "
                f"stages {', '.join(f'{k} {v:.1f}' for k, v in r['stages_us'].items())}, recall@10 {r['recall']:.4f} "
                f"({time.time() - t0:.0f} s)")
    c = res["configs"]
    res["partition_fetch_bytes"] = c["naive"]["per_query"]["bytes"] / max(1, c["naive"]["per_query"]["fetches"])
    res["ratio"] = c["naive"]["total_us"] / c["full"]["total_us"]
    res["best"] = min((n for n, _ in CONFIGS), key=lambda n: c[n]["total_us"])
    res["ratio_best"] = c["naive"]["total_us"] / c[res["best"]]["total_us"]
    results["partitions"][P] = res

checks = [{"P": P, "what": f"naive / full >= {a.min_ratio:g}",
           "value": f"{r['configs']['naive']['total_us']:.0f} / {r['configs']['full']['total_us']:.1f} us = {r['ratio']:.1f}x",
           "ok": r["ratio"] >= a.min_ratio} for P, r in results["partitions"].items()]
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
results["any_ok"] = any(c["ok"] for c in checks)
results["seconds"] = time.time() - t_start

md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min): `{results['command']}`\n\n"
      f"{a.set}, 1 memnode (`{a.provider}`, wire {a.wire}), 1 computenode, M={a.m}, efConstruction={a.ef_construction}, b={a.probe}, "
      f"efSearch={a.ef_search}, batch {a.batch}, cache 10 % of the partitions (regrouped configurations); "
      f"{a.warmup} warm-up + {a.queries} measured queries (naive: {a.naive_queries}, no warm-up), uniform, seed "
      f"{a.seed}; median of {a.repeats} run(s). Latency = wall time per query (`stages_us.pipelined_total`); "
      f"stage columns: busy time per query.\n\n"]
rows = []
for P, r in results["partitions"].items():
    full = r["configs"]["full"]["total_us"]
    for name, _ in CONFIGS:
        x = r["configs"][name]
        st = x["stages_us"]
        rows.append([P, f"{r['partition_vectors']:.0f} ({r['partition_fetch_bytes'] / 2**20:.1f} MiB)", LABEL[name],
                     f"**{x['total_us']:.1f}**", " / ".join(f"{v:.0f}" for v in x["total_us_all"]),
                     f"{x['total_us'] / full:.1f}x",
                     f"{st['meta']:.1f}", f"{st['fetch']:.1f}", f"{st['deserialize']:.1f}", f"{st['search']:.1f}",
                     f"{x['batches']['fetched']:.1f} / {x['batches']['needed']:.1f}",
                     f"{x['per_query']['bytes'] / 2**10:.0f}", f"{x['recall']:.4f}"])
md.append(dmh.md_table(["P", "partition: vectors (fetch)", "configuration", "us/query", "runs", "vs full", "meta",
                        "fetch", "deser.", "search", "fetched / needed per batch", "KiB/query", "recall@10"], rows))
md.append(f"\nCriterion (naive / full >= {a.min_ratio:g}; the paper: 430x on SIFT1M, 117x on GIST1M):\n\n")
md += [f"- P={c['P']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n" for c in checks]
md.append("\nNaive against the fastest configuration: " + "; ".join(
    f"P={P}: {LABEL[r['best']]}, {r['ratio_best']:.1f}x" for P, r in results["partitions"].items()) + ".\n")
md.append("\n![per-query latency per configuration](dhnsw_ablation.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    fig, ax = plt.subplots(figsize=(3 + 2.4 * len(Ps), 4.4))
    w = 0.8 / len(CONFIGS)
    colors = ["0.55", "C0", "C2", "C3"]
    for i, (name, _) in enumerate(CONFIGS):
        xs = [j + (i - (len(CONFIGS) - 1) / 2) * w for j in range(len(Ps))]
        vals = [results["partitions"][P]["configs"][name]["total_us"] for P in Ps]
        bars = ax.bar(xs, vals, w, color=colors[i], label=LABEL[name])
        ax.bar_label(bars, labels=[f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in vals], fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(Ps)))
    ax.set_xticklabels([f"P={P} ({results['partitions'][P]['partition_vectors']:.0f} vectors/partition)\n"
                        f"naive/full = {results['partitions'][P]['ratio']:.0f}x" for P in Ps], fontsize=8)
    ax.set_ylabel("latency per query (us, log)")
    ax.set_title(f"d-HNSW ablation, {a.set}, b={a.probe}, efSearch={a.ef_search}, batch {a.batch}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "dhnsw_ablation.png", dpi=110)
dmh.dhnsw_finish(out, HERE, results, md)
print(f"criterion holds for P in {[c['P'] for c in checks if c['ok']]}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'dhnsw_ablation.png'} ({results['seconds']:.0f} s)")
