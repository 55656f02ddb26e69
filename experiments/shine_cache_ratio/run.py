#!/usr/bin/python3
"""Impact of the cache size, like Figure 11 of the SHINE paper (see README.md here).

Uniform workload; per data set: Shine-Baseline (no cache, one run: it does not depend on the
cache size) and, for every cache ratio (cache per computenode as a share of the index size),
Shine-Cached (routing none) and Shine-Cached-Aqr (adaptive routing), each a query run of K
computenodes against 2 memnodes serving a stored index. Prints and plots QPS and cache hit
rate (CHR) against the cache ratio, and the QPS gain of both cached variants over the baseline.

  experiments/shine_cache_ratio/run.py [--sets wordnet,syn100k] [--ratios 0.02,0.04,0.06,0.08,0.10]
      [--dist uniform] [--num-cns 4] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHED = ["cached", "cached-aqr"]
VARIANTS, LABEL, COLOR = dmh.VARIANTS, dmh.LABEL, dmh.COLOR

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap)
ap.add_argument("--ratios", default="0.02,0.04,0.06,0.08,0.10", help="cache ratios (default %(default)s)")
ap.add_argument("--dist", default="uniform", help="workload distribution (default %(default)s, like the paper)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_cache_ratio"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())
if a.quick:
    a.ratios = "0.02,0.10"

work, out, t_start, results = dmh.experiment_start("shine_cache_ratio", a, HERE)
sets, ratios = a.sets.split(","), [float(x) for x in a.ratios.split(",")]
dmh.log(f"shine_cache_ratio: sets {sets}, {a.dist}, ratios {ratios}, {a.num_cns} computenodes")
for name in sets:
    images, flags, index_info = dmh.shine_set(a, name)
    wl = dmh.shine_workload(name, a.index_work, a.dist, a.queries, a.warmup, a.seed)
    d = work / name / a.dist.replace(":", "")
    dmh.log(f"{name} {a.dist}")
    base = dmh.shine_measure(images, a.num_cns, wl, d, "baseline", variant="baseline", repeats=a.repeats, **flags)
    points = []
    for ratio in ratios:
        p = {"ratio": ratio}
        for v in CACHED:
            p[v] = dmh.shine_measure(images, a.num_cns, wl, d, f"{v}-c{ratio:g}", variant=v, cache_ratio=ratio,
                                     repeats=a.repeats, **flags)
        points.append(p)
    results["sets"][name] = {"index": index_info,
                             "baseline": base, "points": points}
results["seconds"] = time.time() - t_start

md = [dmh.shine_header_md(a, results)]
for name, s in results["sets"].items():
    b = s["baseline"]
    c = s["points"][0]["cached"].get("cache") or {}
    md.append(f"\n**{name}**, {a.dist} (index {c.get('index_bytes', 0) / 2**20:.0f} MiB, efSearch {b['ef_search']}); "
              f"Shine (no cache): "
              f"{b['qps']:.0f} QPS, recall {b['recall']:.4f}\n\n")
    rows = []
    for p in s["points"]:
        cc, aq = p["cached"], p["cached-aqr"]
        rows.append([f"{p['ratio']:g}", f"{(cc.get('cache') or {}).get('capacity_bytes', 0) / 2**20:.1f}",
                     f"{b['qps']:.0f}", f"{cc['qps']:.0f}", f"{aq['qps']:.0f}", f"{cc['qps'] / b['qps']:.2f}x",
                     f"{aq['qps'] / b['qps']:.2f}x", dmh.pct(cc["chr"]), dmh.pct(aq["chr"]),
                     f"{min(cc['recall'], aq['recall'], b['recall']):.4f}"])
    md.append(dmh.md_table(["cache ratio", "MiB/cn", "QPS no cache", "QPS Cached", "QPS Cached-Aqr",
                            "Cached / none", "Aqr / none", "CHR Cached", "CHR Cached-Aqr", "min recall"], rows))
md.append("\n![QPS and CHR against the cache ratio](shine_cache_ratio.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.8 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        s = results["sets"][name]
        xs = [100 * p["ratio"] for p in s["points"]]
        ax_q, ax_c = axes[row]
        ax_q.plot(xs, [s["baseline"]["qps"]] * len(xs), "--", color=COLOR["baseline"], label=LABEL["baseline"])
        for v in CACHED:
            ax_q.plot(xs, [p[v]["qps"] for p in s["points"]], "o-", color=COLOR[v], label=LABEL[v])
            ax_c.plot(xs, [p[v]["chr"] for p in s["points"]], "o-", color=COLOR[v], label=LABEL[v])
        ax_q.set_ylim(bottom=0)
        ax_q.set_ylabel("throughput (queries/s)")
        ax_c.set_ylabel("cache hit rate")
        ax_c.set_ylim(0, 1)
        for ax in (ax_q, ax_c):
            ax.set_xlabel("cache size ratio (% of the index per computenode)")
            ax.set_xticks(xs)
            ax.set_title(f"{name}, {a.dist}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "shine_cache_ratio.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE else None)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'shine_cache_ratio.png'}")
