#!/usr/bin/python3
"""Partition sizes of d-HNSW's capacity-constrained k-means against plain k-means, like
Figure 17 of the d-HNSW paper (see README.md here).

For each data set and number of partitions P, dhnsw-build builds the index twice: with the
capacity-constrained k-means (every partition at most ceil(N/P) vectors) and with
--plain-kmeans (the same initialisation, plain Lloyd iterations). The partition sizes come
from the build report (partitions.sizes): min / mean / max, max/mean, standard deviation.
Criterion: max/mean <= 1.05 for the capacity-constrained partitioning. For context, each
index is also queried (1 memnode, 1 computenode, batch 1000, efSearch 64, b = 1 and 2,
uniform workload from the query pool): recall@10 and wall time per query.

  experiments/dhnsw_partitions/run.py [--sets syn100k,wordnet,bigann10k] [--partitions 16,64]
      [--recall-probes 1,2] [--quick]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
METHODS = [("capacity", False, "capacity-constrained k-means (d-HNSW)"), ("plain", True, "plain k-means")]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sets", default="syn100k,wordnet,bigann10k", help="data sets (default %(default)s)")
ap.add_argument("--partitions", default="16,64", help="P values (default %(default)s)")
ap.add_argument("--max-over-mean", type=float, default=1.05, help="criterion: max/mean <= X for ours (default %(default)s)")
ap.add_argument("--recall-probes", default="1,2", help="b values of the recall runs; empty: none (default %(default)s)")
ap.add_argument("--recall-ef", type=int, default=64, help="efSearch of the recall runs (default %(default)s)")
ap.add_argument("--recall-queries", type=int, default=2000, help="queries of the recall runs (default %(default)s)")
dmh.dhnsw_common_args(ap, quick_help="smoke run: bigann10k, P=16; results go to WORK/quick/dhnsw_partitions/")
a = ap.parse_args()
if a.quick:
    a.sets, a.partitions, a.recall_queries = "bigann10k", "16", 500
    a.timeout = min(a.timeout, 300)

work, out, t_start, results = dmh.dhnsw_start("dhnsw_partitions", a, HERE)
sets = a.sets.split(",")
Ps = [int(x) for x in a.partitions.split(",")]
rprobes = [int(x) for x in a.recall_probes.split(",") if x]
results["sets"] = {}
dmh.log(f"dhnsw_partitions: {sets}, P {Ps}, recall runs b {rprobes} efSearch {a.recall_ef}")
for name in sets:
    results["sets"][name] = {}
    wl = dmh.shine_workload(name, dmh.SHINE_WORK, "uniform", a.recall_queries, 0, a.seed) if rprobes else None
    for P in Ps:
        entry = {}
        for key, plain, _ in METHODS:
            images = dmh.dhnsw_index(name, a.work, P, a.m, a.ef_construction, plain=plain)
            info = dmh.dhnsw_index_info(images)
            part = info.get("partitions", {})
            sizes = part.get("sizes")
            if not sizes:
                raise SystemExit(f"{images[0].parent / 'build.json'} has no partitions.sizes")
            mean = sum(sizes) / len(sizes)
            std = statistics.pstdev(sizes)
            e = {"sizes": sizes, "n": sum(sizes), "min": min(sizes), "max": max(sizes), "mean": mean, "std": std,
                 "cv": std / mean, "max_over_mean": max(sizes) / mean, "min_over_mean": min(sizes) / mean,
                 "inertia": part.get("inertia"), "partition_seconds": info.get("seconds", {}).get("partition"),
                 "build_seconds": info.get("seconds", {}).get("total"), "index_dir": str(images[0].parent),
                 "recall": {}}
            for b in rprobes:
                rep = dmh.dhnsw_query(images, 1, wl, work / "partitions" / name / f"p{P}_{key}_b{b}.json", batch=1000,
                                      probe=b, ef_search=a.recall_ef, provider=a.provider, wire=a.wire, region=a.region,
                                      timeout=a.timeout)
                x = dmh.dhnsw_run_summary(rep["runs"][0])
                e["recall"][b] = {"recall": x["recall"], "recall_at_1": x["recall_at_1"], "total_us": x["total_us"]}
            entry[key] = e
            dmh.log(f"  {name} P={P} {key}: sizes {e['min']}..{e['max']} (mean {mean:.1f}, std {std:.1f}, max/mean "
                    f"{e['max_over_mean']:.3f})" + "".join(f", b={b} recall@10 {v['recall']:.4f}" for b, v in e["recall"].items()))
        results["sets"][name][P] = entry

checks = [{"set": name, "P": P, "what": f"max/mean <= {a.max_over_mean}",
           "value": f"{e['capacity']['max']} / {e['capacity']['mean']:.1f} = {e['capacity']['max_over_mean']:.4f} "
                    f"(plain k-means: {e['plain']['max_over_mean']:.2f})",
           "ok": e["capacity"]["max_over_mean"] <= a.max_over_mean}
          for name, s in results["sets"].items() for P, e in s.items()]
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
results["seconds"] = time.time() - t_start

md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min): `{results['command']}`\n\n"
      f"dhnsw-build, M={a.m}, efConstruction={a.ef_construction}, 10 k-means rounds, seed 1; sizes in vectors per "
      f"partition; std = population standard deviation, CV = std / mean; inertia = sum of distances vector -> its "
      f"centroid (squared L2, or 1 - <x, c> for ip)."
      + (f" Recall runs: 1 memnode, 1 computenode, batch 1000, efSearch {a.recall_ef}, {a.recall_queries} queries "
         f"drawn uniformly from the pool; us = wall time per query (noisy)." if rprobes else "") + "\n\n"]
rows = []
for name, s in results["sets"].items():
    for P, entry in s.items():
        for key, _, label in METHODS:
            e = entry[key]
            rows.append([name, P, label, e["min"], f"{e['mean']:.1f}", e["max"], f"**{e['max_over_mean']:.3f}**",
                         f"{e['min_over_mean']:.3f}", f"{e['std']:.1f}", f"{e['cv']:.3f}", f"{e['inertia']:.4g}"] +
                        [f"{e['recall'][b]['recall']:.4f} ({e['recall'][b]['total_us']:.0f} us)" for b in rprobes])
md.append(dmh.md_table(["set", "P", "partitioning", "min", "mean", "max", "max/mean", "min/mean", "std", "CV",
                        "inertia"] + [f"recall@10 b={b}" for b in rprobes], rows))
md.append(f"\nCriterion (capacity-constrained: max/mean <= {a.max_over_mean}):\n\n")
md += [f"- {c['set']} P={c['P']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n" for c in checks]
md.append("\n![sorted partition sizes](dhnsw_partitions.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), len(Ps), figsize=(5.2 * len(Ps), 3.4 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for col, P in enumerate(Ps):
            ax = axes[row][col]
            entry = results["sets"][name][P]
            for i, (key, _, label) in enumerate(METHODS):
                e = entry[key]
                sz = sorted(e["sizes"], reverse=True)
                ax.step(range(1, len(sz) + 1), sz, where="mid", color=["C0", "C3"][i], lw=1.8,
                        label=f"{label}: max/mean {e['max_over_mean']:.2f}, CV {e['cv']:.2f}")
            ax.axhline(entry["capacity"]["mean"], color="0.4", ls="--", lw=1, label=f"mean N/P = {entry['capacity']['mean']:.0f}")
            ax.set_ylim(bottom=0)
            ax.set_xlabel("partition (sorted by size)")
            ax.set_ylabel("vectors")
            ax.set_title(f"{name}, P={P}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "dhnsw_partitions.png", dpi=110)
dmh.dhnsw_finish(out, HERE, results, md)
print(f"criterion: {'holds' if results['all_ok'] else 'does NOT hold everywhere'}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'dhnsw_partitions.png'} ({results['seconds']:.0f} s)")
