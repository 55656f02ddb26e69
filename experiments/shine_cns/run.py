#!/usr/bin/python3
"""Cache segmentation penalty against the number of computenodes, like Figure 10 of the SHINE
paper (see README.md here).

Per data set and workload distribution, for K = 2, 3, 4, 5 computenodes: Shine-Cached (5 %
cache per computenode, routing none) and Shine-Cached-Aqr (the same cache, logical partitioning
into K partitions + adaptive routing), each a traced query run against 2 memnodes serving a
stored index. csp-report replays the traces of the 2 x len(K) runs of a data set and
distribution together (--x num_cns; its JSON and PNG are kept here as csp_report_<set>_<dist>.*):
CHR of the computenodes' own caches, CHR_max of one shared cache of the summed capacity and
CSP = 1 - CHR / CHR_max. Also prints the mean ratio CSP(Cached) / CSP(Cached-Aqr) (the paper:
2.3x on average).

  experiments/shine_cns/run.py [--sets wordnet,syn100k] [--dists uniform,zipf:1.0] [--cns 2,3,4,5]
      [--cache-ratio 0.05] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = ["cached", "cached-aqr"]
LABEL = {"cached": "Shine-Cached (none)", "cached-aqr": "Shine-Cached-Aqr (adaptive)"}
COLOR = {"cached": "C0", "cached-aqr": "C3"}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap)
ap.add_argument("--cns", default="2,3,4,5", help="numbers of computenodes (default %(default)s)")
ap.add_argument("--dists", default="uniform,zipf:1.0", help="workload distributions (default %(default)s)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_cns"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None, help="results.json/results.md/PNGs (default: this folder; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())
if a.quick:
    a.cns = "2,3"

work, out, t_start, results = dmh.experiment_start("shine_cns", a, HERE)
out.mkdir(parents=True, exist_ok=True)
sets, dists, cns = a.sets.split(","), a.dists.split(","), [int(x) for x in a.cns.split(",")]
dmh.log(f"shine_cns: sets {sets}, dists {dists}, computenodes {cns}, cache {a.cache_ratio:g}")
keep = int(a.keep_traces_gb * 2**30)
for name in sets:
    images, flags, index_info = dmh.shine_set(a, name)
    results["sets"][name] = {"index": index_info,
                             "dists": {}}
    for dist in dists:
        wl = dmh.shine_workload(name, a.index_work, dist, a.queries, a.warmup, a.seed)
        d = work / name / dist.replace(":", "")
        dmh.log(f"{name} {dist}")
        points = []
        for k in cns:
            p = {"num_cns": k}
            for v in VARIANTS:  # traces kept until the group's csp-report below
                p[v] = dmh.shine_measure(images, k, wl, d, f"{v}-k{k}", variant=v, cache_ratio=a.cache_ratio,
                                         repeats=a.repeats, trace=True, csp=False, **flags)
            points.append(p)
        # one csp-report over the group: its JSON and its plot (--x num_cns)
        tag = f"{name}_{dist.replace(':', '')}"
        dirs = [p[v]["trace_dir"] for p in points for v in VARIANTS]
        dmh.log(f"  csp-report over {len(dirs)} runs ({sum(dmh.dir_bytes(x) for x in dirs) / 2**30:.2f} GiB of traces)")
        runs = dmh.csp_report(dirs, out / f"csp_report_{tag}.json", png=out / f"csp_report_{tag}.png", x="num_cns")
        it = iter(runs)
        for p in points:
            for v in VARIANTS:
                cr = next(it)
                p[v].update({"chr_trace": cr["chr"], "chr_max": cr["chr_max"], "csp": cr["csp"], "csp_report": cr})
                p[v]["trace_dropped"] = dmh.drop_traces(p[v]["trace_dir"], keep)
        results["sets"][name]["dists"][dist] = points
results["seconds"] = time.time() - t_start

ratios = [p["cached"]["csp"] / p["cached-aqr"]["csp"] for s in results["sets"].values() for pts in s["dists"].values()
          for p in pts if p["cached-aqr"]["csp"] > 0]
results["mean_csp_ratio"] = sum(ratios) / len(ratios) if ratios else None

md = [dmh.shine_header_md(a, results, what=f"{','.join(map(str, cns))} computenodes")]
for name, s in results["sets"].items():
    md.append(dmh.cache_md(name, next(iter(s["dists"].values()))[0]["cached"]))
    rows = []
    for dist, pts in s["dists"].items():
        for p in pts:
            cc, aq = p["cached"], p["cached-aqr"]
            rows.append([dist, p["num_cns"], dmh.pct(cc["chr"]), dmh.pct(cc["chr_max"]), dmh.pct(cc["csp"]),
                         dmh.pct(aq["chr"]), dmh.pct(aq["chr_max"]), dmh.pct(aq["csp"]),
                         f"{cc['csp'] / aq['csp']:.2f}x" if aq["csp"] > 0 else "—",
                         f"{cc['qps']:.0f} / {aq['qps']:.0f}"])
    md.append(dmh.md_table(["workload", "cns", "CHR Cached", "CHR_max", "CSP Cached", "CHR Cached-Aqr", "CHR_max",
                            "CSP Cached-Aqr", "CSP ratio", "QPS Cached / Aqr"], rows))
if results["mean_csp_ratio"] is not None:
    md.append(f"\nMean CSP(Cached) / CSP(Cached-Aqr) over all points: **{results['mean_csp_ratio']:.2f}x** "
              f"(the paper: 2.3x).\n")
md.append("\n![CSP and CHR against the number of computenodes](shine_cns.png)\n\n"
          "csp-report's own plots: " + ", ".join(f"[{n} {d}](csp_report_{n}_{d.replace(':', '')}.png)"
                                                for n in results["sets"] for d in dists) + "\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(len(names), 2 * len(dists), figsize=(5 * 2 * len(dists), 3.6 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        for j, dist in enumerate(dists):
            pts = results["sets"][name]["dists"][dist]
            xs = [p["num_cns"] for p in pts]
            ax_s, ax_c = axes[row][2 * j], axes[row][2 * j + 1]
            for v in VARIANTS:
                ax_s.plot(xs, [p[v]["csp"] for p in pts], "o-", color=COLOR[v], label=LABEL[v])
                ax_c.plot(xs, [p[v]["chr"] for p in pts], "o-", color=COLOR[v], label=f"{LABEL[v]} CHR")
                ax_c.plot(xs, [p[v]["chr_max"] for p in pts], "s--", color=COLOR[v], alpha=0.6, label=f"{LABEL[v]} CHR_max")
            ax_s.set_ylabel("CSP")
            ax_s.set_ylim(0, 1)
            ax_c.set_ylabel("cache hit rate")
            ax_c.set_ylim(0, 1)
            ax_s.set_title(f"{name}, {dist}: CSP = 1 - CHR/CHR_max", fontsize=10)
            ax_c.set_title(f"{name}, {dist}: CHR and CHR_max", fontsize=10)
            for ax in (ax_s, ax_c):
                ax.set_xlabel("computenodes")
                ax.set_xticks(xs)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "shine_cns.png", dpi=110)
dmh.write_results(out, results, md, readme=HERE / "README.md" if out.resolve() == HERE else None)
print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'shine_cns.png'} and csp-report's csp_report_*.png")
