#!/usr/bin/python3
"""Impact of the workload skew, like Figure 12 of the SHINE paper (see README.md here).

Per data set and Zipf exponent s: Shine-Baseline (no cache), Shine-Cached (5 % cache per
computenode, routing none) and Shine-Cached-Aqr (adaptive routing), each a query run of K
computenodes against 2 memnodes serving a stored index, on a zipf:s workload. Prints and plots
QPS and cache hit rate (CHR) against s.

  experiments/shine_skew/run.py [--sets wordnet,syn100k] [--skews 0.5,0.75,1.0,1.25,1.5]
      [--num-cns 4] [--cache-ratio 0.05] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS, LABEL, COLOR = dmh.VARIANTS, dmh.LABEL, dmh.COLOR

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap)
ap.add_argument("--skews", default="0.5,0.75,1.0,1.25,1.5", help="Zipf exponents s (default %(default)s, like the paper)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_skew"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())
if a.quick:
    a.skews = "0.5,1.5"

work, out, t_start, results = dmh.experiment_start("shine_skew", a, HERE)
sets, skews = a.sets.split(","), [float(x) for x in a.skews.split(",")]
dmh.log(f"shine_skew: sets {sets}, zipf s {skews}, {a.num_cns} computenodes, cache {a.cache_ratio:g}")
for name in sets:
    images, flags, index_info = dmh.shine_set(a, name)
    points = []
    for sk in skews:
        dist = f"zipf:{sk:g}"
        wl = dmh.shine_workload(name, a.index_work, dist, a.queries, a.warmup, a.seed)
        dmh.log(f"{name} {dist}")
        p = {"s": sk, "dist": dist}
        for v in VARIANTS:
            p[v] = dmh.shine_measure(images, a.num_cns, wl, work / name / f"zipf{sk:g}", v, variant=v,
                                     cache_ratio=a.cache_ratio, repeats=a.repeats, **flags)
        points.append(p)
    results["sets"][name] = {"index": index_info,
                             "points": points}
results["seconds"] = time.time() - t_start

md = [dmh.shine_header_md(a, results)]
for name, s in results["sets"].items():
    md.append(dmh.cache_md(name, s["points"][0]["cached"]))
    rows = []
    for p in s["points"]:
        b, cc, aq = p["baseline"], p["cached"], p["cached-aqr"]
        rows.append([f"{p['s']:g}", f"{b['qps']:.0f}", f"{cc['qps']:.0f}", f"{aq['qps']:.0f}",
                     f"{aq['qps'] / cc['qps']:.2f}x", dmh.pct(cc["chr"]), dmh.pct(aq["chr"]),
                     f"{min(b['recall'], cc['recall'], aq['recall']):.4f}"])
    md.append(dmh.md_table(["zipf s", "QPS no cache", "QPS Cached", "QPS Cached-Aqr", "Aqr / Cached",
                            "CHR Cached", "CHR Cached-Aqr", "min recall"], rows))
md.append("\n![QPS and CHR against the Zipf exponent](shine_skew.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.8 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        pts = results["sets"][name]["points"]
        xs = [p["s"] for p in pts]
        ax_q, ax_c = axes[row]
        for v in VARIANTS:
            ax_q.plot(xs, [p[v]["qps"] for p in pts], "o-" if v != "baseline" else "s--", color=COLOR[v], label=LABEL[v])
            if v != "baseline":
                ax_c.plot(xs, [p[v]["chr"] for p in pts], "o-", color=COLOR[v], label=LABEL[v])
        ax_q.set_ylim(bottom=0)
        ax_q.set_ylabel("throughput (queries/s)")
        ax_c.set_ylabel("cache hit rate")
        ax_c.set_ylim(0, 1)
        for ax in (ax_q, ax_c):
            ax.set_xlabel("Zipf exponent s")
            ax.set_xticks(xs)
            ax.set_title(name, fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "shine_skew.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE else None)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'shine_skew.png'}")
