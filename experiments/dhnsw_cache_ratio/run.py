#!/usr/bin/python3
"""d-HNSW query latency against the share of partitions cached on the computenode, like
Figure 15 of the d-HNSW paper (see README.md here).

On syn100k with many partitions (P=64, 1562 vectors each), probe b=2, efSearch 32: for each
batch size B, workload distribution and cache ratio r (the computenode keeps round(r x P)
deserialized sub-HNSWs across batches in an LRU, `--cache-ratio r`), one memnode and one
computenode run WARMUP + QUERIES queries; REPEATS runs per point, the median latency.
Latency: wall time per query (stages_us.pipelined_total) and the median batch latency per
query (latency_us.p50); also the sub-HNSWs a batch needs, fetches and cache hits per batch.
A cache only saves fetches of partitions a batch needs that the previous batches left in
it; with batches that need almost every partition (B=200 here: 63.8 of 64) it saves c
fetches per batch, with smaller batches (B=50: about 49 of 64) fewer.

  experiments/dhnsw_cache_ratio/run.py [--partitions 64] [--batches 50,200] [--ratios 0,0.05,0.1,0.15,0.2]
      [--dists uniform,zipf:1.0,hot-clusters:1.0] [--queries 4000] [--warmup 1000] [--repeats 3] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="syn100k", help="data set (default %(default)s)")
ap.add_argument("--partitions", type=int, default=64, help="P (default %(default)s)")
ap.add_argument("--batches", default="50,200", help="B values (default %(default)s)")
ap.add_argument("--probe", type=int, default=2, help="b (default %(default)s)")
ap.add_argument("--ef-search", type=int, default=32, help="efSearch (default %(default)s)")
ap.add_argument("--ratios", default="0,0.05,0.1,0.15,0.2", help="cache ratios (default %(default)s)")
ap.add_argument("--dists", default="uniform,zipf:1.0,hot-clusters:1.0",
                help="workload distributions over the query pool (default %(default)s)")
ap.add_argument("--queries", type=int, default=4000, help="measured queries (default %(default)s)")
ap.add_argument("--warmup", type=int, default=1000, help="warm-up queries (default %(default)s)")
ap.add_argument("--repeats", type=int, default=3, help="runs per point, median latency (default %(default)s)")
dmh.dhnsw_common_args(ap, quick_help="smoke run: B=50, ratios 0,0.2, uniform and zipf:1.0, 1000 + 200 warm-up "
                                     "queries, 1 run each; results go to WORK/quick/dhnsw_cache_ratio/")
a = ap.parse_args()
if a.quick:
    a.batches, a.ratios, a.dists, a.queries, a.warmup, a.repeats = "50", "0,0.2", "uniform,zipf:1.0", 1000, 200, 1
    a.timeout = min(a.timeout, 300)

work, out, t_start, results = dmh.dhnsw_start("dhnsw_cache_ratio", a, HERE)
Bs = [int(x) for x in a.batches.split(",")]
ratios = [float(x) for x in a.ratios.split(",")]
dists = a.dists.split(",")
images = dmh.dhnsw_index(a.set, a.work, a.partitions, a.m, a.ef_construction)
info = dmh.dhnsw_index_info(images)
results["index"] = {"dir": str(images[0].parent), "partitions": a.partitions, "partition_vectors": info["partitions"]["mean"]}
results["points"] = []
dmh.log(f"dhnsw_cache_ratio: {a.set} P={a.partitions}, B {Bs}, ratios {ratios}, dists {dists}, b={a.probe}, "
        f"efSearch {a.ef_search}, {a.warmup} + {a.queries} queries, {a.repeats} run(s) each")
for B in Bs:
    for dist in dists:
        wl = dmh.shine_workload(a.set, dmh.SHINE_WORK, dist, a.queries, a.warmup, a.seed)
        for r in ratios:
            t0 = time.time()
            x = dmh.dhnsw_measure(images, wl, work / "cache_ratio" / f"B{B}" / dist.replace(":", "") / f"r{r:g}",
                                  a.repeats, batch=B, probe=a.probe, ef_search=a.ef_search, cache_ratio=r,
                                  provider=a.provider, wire=a.wire, region=a.region, timeout=a.timeout)
            x.update({"batch": B, "dist": dist, "ratio": r, "cache_subs": x["settings"]["cache_subs"]})
            results["points"].append(x)
            b = x["batches"]
            dmh.log(f"  B={B} {dist} r={r:g} (c={x['cache_subs']}): {x['total_us']:.1f} us/query (all "
                    f"{[round(v) for v in x['total_us_all']]}), p50 {x['latency_us']['p50']:.1f}, needed {b['needed']:.1f}, "
                    f"fetched {b['fetched']:.1f}, hits {b['cache_hits']:.1f} per batch ({time.time() - t0:.0f} s)")
results["seconds"] = time.time() - t_start


def point(B, dist, r):
    return next(p for p in results["points"] if p["batch"] == B and p["dist"] == dist and p["ratio"] == r)


md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min): `{results['command']}`\n\n"
      f"{a.set}, P={a.partitions} ({info['partitions']['mean']:.0f} vectors per partition), 1 memnode (`{a.provider}`, wire {a.wire}), "
      f"1 computenode, M={a.m}, efConstruction={a.ef_construction}, b={a.probe}, efSearch={a.ef_search}, "
      f"{a.warmup} warm-up + {a.queries} measured queries (seed {a.seed}), median of {a.repeats} run(s) (by wall "
      f"time per query). c = cached sub-HNSWs = round(r x P). Per batch: sub-HNSWs needed, fetched, cache hits.\n"]
for B in Bs:
    md.append(f"\n**batch {B}**\n\n")
    rows = []
    for dist in dists:
        base = point(B, dist, ratios[0])["total_us"]
        for r in ratios:
            x = point(B, dist, r)
            st, b = x["stages_us"], x["batches"]
            rows.append([dist, f"{r:g}", x["cache_subs"], f"**{x['total_us']:.1f}**",
                         " / ".join(f"{v:.0f}" for v in x["total_us_all"]), f"{x['total_us'] / base:.2f}",
                         f"{x['latency_us']['p50']:.1f}", f"{b['needed']:.1f}", f"{b['fetched']:.1f}",
                         f"{b['cache_hits']:.1f}", f"{x['per_query']['bytes'] / 2**10:.0f}",
                         f"{st['fetch']:.0f} / {st['deserialize']:.0f} / {st['search']:.0f}"])
    md.append(dmh.md_table(["workload", "ratio", "c", "us/query", "runs", f"vs r={ratios[0]:g}", "p50 us",
                            "needed", "fetched", "hits", "KiB/query", "fetch / deser. / search us"], rows))
md.append("\n![latency and cache hits vs cache ratio](dhnsw_cache_ratio.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    fig, axes = plt.subplots(2, len(Bs), figsize=(5.5 * len(Bs), 7.5), squeeze=False)
    for col, B in enumerate(Bs):
        ax, ax2 = axes[0][col], axes[1][col]
        for i, dist in enumerate(dists):
            xs = [point(B, dist, r) for r in ratios]
            ax.plot([100 * r for r in ratios], [x["total_us"] for x in xs], "o-", color=f"C{i}", label=f"{dist}: wall/query")
            ax.plot([100 * r for r in ratios], [x["latency_us"]["p50"] for x in xs], "s--", color=f"C{i}", alpha=0.6,
                    label=f"{dist}: batch p50")
            ax2.plot([100 * r for r in ratios], [x["batches"]["cache_hits"] for x in xs], "o-", color=f"C{i}",
                     label=f"{dist}: cache hits")
            ax2.plot([100 * r for r in ratios], [x["batches"]["fetched"] for x in xs], "^:", color=f"C{i}",
                     label=f"{dist}: fetched")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("cache ratio (% of the partitions)")
        ax.set_ylabel("latency per query (us)")
        ax.set_title(f"{a.set} P={a.partitions}, batch {B}, b={a.probe}, efSearch {a.ef_search}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax2.set_xlabel("cache ratio (% of the partitions)")
        ax2.set_ylabel("sub-HNSWs per batch")
        ax2.set_title(f"batch {B}: cache hits and fetches per batch", fontsize=10)
        ax2.set_ylim(bottom=0)
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "dhnsw_cache_ratio.png", dpi=110)
dmh.dhnsw_finish(out, HERE, results, md)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'dhnsw_cache_ratio.png'} ({results['seconds']:.0f} s)")
