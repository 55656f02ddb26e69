#!/usr/bin/python3
"""Query routing policies, like Figure 7 of the SHINE paper (see README.md here).

Per data set and workload distribution: the node cache on every computenode (5 % of the index)
and the four routing policies none, best-fit, balanced and adaptive, each a query run of K
computenodes against 2 memnodes serving a stored index. QPS and cache hit rate (CHR) are shown
normalised to no routing; the load (queries answered) of the busiest computenode against the
mean shows best-fit's execution skew. Checks: adaptive QPS >= best-fit QPS under zipf:1.0.

  experiments/shine_routing/run.py [--sets wordnet,syn100k] [--dists uniform,zipf:1.0]
      [--policies none,best-fit,balanced,adaptive] [--num-cns 4] [--cache-ratio 0.05] [--quick]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap)
ap.add_argument("--dists", default="uniform,zipf:1.0", help="workload distributions (default %(default)s)")
ap.add_argument("--policies", default="none,best-fit,balanced,adaptive", help="routing policies; the first is the "
                "normalisation reference; adaptive:even / adaptive:demand set its --adaptive-quota for that run "
                "(plain adaptive: --adaptive-quota) (default %(default)s)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_routing"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())

work, out, t_start, results = dmh.experiment_start("shine_routing", a, HERE)
sets, dists, policies = a.sets.split(","), a.dists.split(","), a.policies.split(",")
ref = policies[0]
dmh.log(f"shine_routing: sets {sets}, dists {dists}, policies {policies}, {a.num_cns} computenodes, cache {a.cache_ratio:g}")
for name in sets:
    images, flags, index_info = dmh.shine_set(a, name)
    results["sets"][name] = {"index": index_info,
                             "dists": {}}
    for dist in dists:
        wl = dmh.shine_workload(name, a.index_work, dist, a.queries, a.warmup, a.seed)
        dmh.log(f"{name} {dist}")
        res = {}
        for pol in policies:
            routing, f = dmh.policy_flags(flags, pol)
            r = dmh.shine_measure(images, a.num_cns, wl, work / name / dist.replace(":", ""), pol.replace(":", "-"),
                                  routing=routing, cache_ratio=a.cache_ratio, repeats=a.repeats, **f)
            r["load_max_over_mean"] = dmh.load_max_over_mean(r)
            res[pol] = r
        for pol in policies:
            res[pol]["qps_norm"] = res[pol]["qps"] / res[ref]["qps"] if res[ref]["qps"] else None
            res[pol]["chr_norm"] = res[pol]["chr"] / res[ref]["chr"] if res[ref]["chr"] else None
        results["sets"][name]["dists"][dist] = res

checks = []
for name, s in results["sets"].items():
    for dist, res in s["dists"].items():
        if dist.startswith("zipf:1") and float(dist.split(":")[1]) == 1.0:
            checks += dmh.adaptive_checks(res, set=name, dist=dist)
dmh.finish_checks(results, checks, t_start)
num = dmh.num

md = [dmh.shine_header_md(a, results)]
for name, s in results["sets"].items():
    md.append(dmh.cache_md(name, next(iter(s["dists"].values()))[ref]))
    rows = []
    for dist, res in s["dists"].items():
        for pol in policies:
            r = res[pol]
            rows.append([dist, pol, f"{r['qps']:.0f}", num(r["qps_norm"]), dmh.pct(r["chr"]), num(r["chr_norm"]),
                         num(r["load_max_over_mean"]), f"{r['recall']:.4f}"])
    md.append(dmh.md_table(["workload", "routing", "QPS", f"QPS / {ref}", "CHR", f"CHR / {ref}",
                            "busiest cn / mean", "recall@10"], rows))
if checks:
    md.append("\nCheck:\n\n")
    md += [f"- {c['set']} {c['dist']}: {c['what']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n" for c in checks]
md.append(f"\n![QPS and CHR normalised to routing {ref}](shine_routing.png)\n")
md = "".join(md)
print("\n" + md)

# ---- plot (Figure 7): per data set and workload, normalised QPS and CHR per policy
plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), len(dists), figsize=(5.5 * len(dists), 3.6 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for col, dist in enumerate(dists):
            ax, res = axes[row][col], results["sets"][name]["dists"][dist]
            xs = list(range(len(policies)))
            for i, (key, lab, color) in enumerate([("qps_norm", "throughput", "C0"), ("chr_norm", "cache hit rate", "C1")]):
                bars = ax.bar([x + (i - 0.5) * 0.38 for x in xs], [res[p][key] or 0 for p in policies], 0.38,
                              color=color, label=lab)
                ax.bar_label(bars, fmt="%.2f", fontsize=7)
            ax.axhline(1.0, color="0.4", lw=0.8, ls="--")
            ax.set_xticks(xs)
            ax.set_xticklabels(policies)
            ax.set_ylabel(f"normalised to {ref}")
            ax.set_title(f"{name}, {dist}", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "shine_routing.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE else None)
print(f"check: {'holds' if results['all_ok'] else 'does NOT hold'}; wrote {out / 'results.json'}, {out / 'results.md'}, "
      f"{out / 'shine_routing.png'}")
