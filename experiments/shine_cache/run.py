#!/usr/bin/python3
"""Cache efficiency with and without adaptive query routing, like Table 2 of the SHINE paper
(see README.md here).

Per data set and workload distribution: Shine-Baseline (no cache), Shine-Cached (5 % cache per
computenode, no routing) and Shine-Cached-Aqr (the same cache, logical partitioning + adaptive
routing), each a query run of K computenodes against 2 memnodes serving a stored index. The
cached runs record node-cache access traces; csp-report replays them into one shared cache of
the summed capacity (CHR_max) and gives CSP = 1 - CHR / CHR_max. Prints and writes CHR,
CHR_max, CSP, QPS and recall@10, then checks the SHINE paper's cache claims:
  CSP(adaptive) <= 0.6 x CSP(none)       for uniform and zipf:1.0
  CHR(adaptive) >= 1.5 x CHR(none)       for uniform
  recall unchanged (max - min <= 0.005) across the three variants

  experiments/shine_cache/run.py [--sets wordnet,syn100k] [--dists uniform,zipf:1.0] [--num-cns 4]
      [--cache-ratio 0.05] [--warmup 5000] [--queries 10000] [--ef-search 64] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = dmh.VARIANTS
LABEL = {"baseline": "Shine (no cache)", "cached": "Shine-Cached (routing none)",
         "cached-aqr": "Shine-Cached-Aqr (adaptive)"}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap)
ap.add_argument("--dists", default="uniform,zipf:1.0", help="workload distributions (default %(default)s)")
ap.add_argument("--csp-factor", type=float, default=0.6, help="criterion CSP(adaptive) <= F x CSP(none) (default %(default)s)")
ap.add_argument("--chr-factor", type=float, default=1.5, help="criterion CHR(adaptive) >= F x CHR(none), uniform (default %(default)s)")
ap.add_argument("--recall-tolerance", type=float, default=0.005, help="criterion on recall (default %(default)s)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_cache"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())

work, out, t_start, results = dmh.experiment_start("shine_cache", a, HERE)
sets, dists = a.sets.split(","), a.dists.split(",")
dmh.log(f"shine_cache: sets {sets}, dists {dists}, {a.num_cns} computenodes x {a.threads} threads x {a.coroutines} "
        f"coroutines, cache {a.cache_ratio:g}, efSearch {a.ef_search}, {a.warmup} warm-up + {a.queries} measured queries")
for name in sets:
    images, flags, index_info = dmh.shine_set(a, name)
    results["sets"][name] = {"index": index_info,
                             "dists": {}}
    for dist in dists:
        wl = dmh.shine_workload(name, a.index_work, dist, a.queries, a.warmup, a.seed)
        dmh.log(f"{name} {dist}")
        res = {}
        for v in VARIANTS:
            res[v] = dmh.shine_measure(images, a.num_cns, wl, work / name / dist.replace(":", ""), v, variant=v,
                                       cache_ratio=a.cache_ratio, repeats=a.repeats, trace=(v != "baseline"),
                                       keep_trace_bytes=int(a.keep_traces_gb * 2**30), **flags)
        results["sets"][name]["dists"][dist] = res

# ---- criteria
checks = []
for name, s in results["sets"].items():
    for dist, res in s["dists"].items():
        c, q = res["cached"], res["cached-aqr"]
        if dist in ("uniform", "zipf:1.0", "zipf:1"):
            checks.append({"set": name, "dist": dist, "what": f"CSP(adaptive) <= {a.csp_factor} x CSP(none)",
                           "value": f"{q['csp']:.3f} vs {a.csp_factor} x {c['csp']:.3f} = {a.csp_factor * c['csp']:.3f}",
                           "ok": q["csp"] <= a.csp_factor * c["csp"]})
        if dist == "uniform":
            checks.append({"set": name, "dist": dist, "what": f"CHR(adaptive) >= {a.chr_factor} x CHR(none)",
                           "value": f"{q['chr']:.3f} vs {a.chr_factor} x {c['chr']:.3f} = {a.chr_factor * c['chr']:.3f}",
                           "ok": q["chr"] >= a.chr_factor * c["chr"]})
        rec = [res[v]["recall"] for v in VARIANTS]
        checks.append({"set": name, "dist": dist, "what": f"recall within {a.recall_tolerance} across the variants",
                       "value": f"{min(rec):.4f}..{max(rec):.4f} (spread {max(rec) - min(rec):.4f})",
                       "ok": max(rec) - min(rec) <= a.recall_tolerance})
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
results["seconds"] = time.time() - t_start

# ---- tables
md = [dmh.shine_header_md(a, results)]
for name, s in results["sets"].items():
    md.append(dmh.cache_md(name, next(iter(s["dists"].values()))["cached"]))
    rows = []
    for dist, res in s["dists"].items():
        for v in VARIANTS:
            r = res[v]
            rows.append([dist, LABEL[v], dmh.pct(r["chr"]) if v != "baseline" else "—", dmh.pct(r.get("chr_max")),
                         dmh.pct(r.get("csp")), f"{r['qps']:.0f}", f"{r['recall']:.4f}"])
    md.append(dmh.md_table(["workload", "variant", "CHR", "CHR_max", "CSP", "QPS", "recall@10"], rows))
md.append("\nCriteria (the SHINE paper's cache claims):\n\n")
md += [f"- {c['set']} {c['dist']}: {c['what']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n" for c in checks]
md.append("\n![CHR, CSP and QPS per variant](shine_cache.png)\n")
md = "".join(md)
print("\n" + md)

# ---- plot: per data set CHR, CSP and QPS, grouped by workload, one bar per variant
plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), 3, figsize=(13, 3.6 * len(names)), squeeze=False)
    colors = {"baseline": "0.6", "cached": "C0", "cached-aqr": "C3"}
    for row, name in enumerate(names):
        ds = results["sets"][name]["dists"]
        xs = list(range(len(ds)))
        for col, (key, title) in enumerate([("chr", "cache hit rate (CHR)"), ("csp", "cache segmentation penalty (CSP)"),
                                            ("qps", "throughput (queries/s)")]):
            ax = axes[row][col]
            vs = VARIANTS if key == "qps" else ["cached", "cached-aqr"]
            w = 0.8 / len(vs)
            for i, v in enumerate(vs):
                vals = [ds[d][v].get(key) or 0 for d in ds]
                bars = ax.bar([x + (i - (len(vs) - 1) / 2) * w for x in xs], vals, w, color=colors[v], label=LABEL[v])
                ax.bar_label(bars, fmt="%.0f" if key == "qps" else "%.2f", fontsize=7)
            ax.set_xticks(xs)
            ax.set_xticklabels(list(ds))
            ax.set_title(f"{name}: {title}", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            if key != "qps":
                ax.set_ylim(0, 1)
        axes[row][0].legend(fontsize=7)
        axes[row][2].legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "shine_cache.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE else None)
print(f"criteria: {'all hold' if results['all_ok'] else 'NOT all hold'}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'shine_cache.png'}")
