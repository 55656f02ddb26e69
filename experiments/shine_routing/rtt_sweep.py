#!/usr/bin/python3
"""Routing policies against the round trip of a remote operation (see README.md here).

On this host a computenode's READs over shm cost it CPU (the initiator copies), and the
computenodes share two cores, so a busy computenode takes the CPU an idle one leaves. With
`computenode --wire R,0` every remote operation takes at least R us and the worker sleeps
meanwhile: like on RDMA NICs, a READ costs wire time and no CPU, and a computenode with a fixed
number of queries in flight is bound by its round trips. This driver runs the routing policies
once per R (R = 0: no wire model) on one data set and workload, and prints QPS, CHR and the
busiest computenode's load per policy and R. Check per R > 0: adaptive QPS >= best-fit QPS.

  experiments/shine_routing/rtt_sweep.py [--rtts 0,50,100,200,400] [--dist zipf:1.0]
      [--policies none,best-fit,balanced,adaptive] [--sets syn100k] [--repeats 3]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
dmh.shine_args(ap, sets="syn100k")
ap.add_argument("--rtts", default="0,50,100,200,400",
                help="wire latencies in us (--wire R,0), 0 = none (default %(default)s)")
ap.add_argument("--dist", default="zipf:1.0", help="workload distribution (default %(default)s)")
ap.add_argument("--policies", default="none,best-fit,balanced,adaptive",
                help="routing policies; adaptive:even / adaptive:demand set --adaptive-quota (default %(default)s)")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_rtt_sweep"), help="run directory (default %(default)s)")
ap.add_argument("--out", default=None,
                help="results.json/results.md/PNG (default: rtt_sweep/ here; WORK/quick with --quick)")
a = dmh.shine_quick(ap.parse_args())
if a.wire != "none":
    ap.error("--wire: this driver sets it per run; use --rtts")

try:
    rtts = [float(x) for x in a.rtts.split(",")]
except ValueError:
    ap.error(f"--rtts: not a comma list of numbers: {a.rtts!r}")
if any(r < 0 for r in rtts):
    ap.error(f"--rtts: round trips must be >= 0: {a.rtts!r}")
policies = a.policies.split(",")
work, out, t_start, results = dmh.experiment_start("shine_rtt_sweep", a, HERE / "rtt_sweep")
results["rtts"] = rtts
dmh.log(f"rtt_sweep: sets {a.sets}, {a.dist}, round trips {rtts} us, policies {policies}, {a.num_cns} computenodes")
for name in a.sets.split(","):
    images, flags, index_info = dmh.shine_set(a, name)
    wl = dmh.shine_workload(name, a.index_work, a.dist, a.queries, a.warmup, a.seed)
    per_rtt = {}
    for rtt in rtts:
        dmh.log(f"{name} {a.dist}, wire latency {rtt:g} us")
        res = {}
        for pol in policies:
            routing, f = dmh.policy_flags(flags, pol)
            f["wire"] = f"{rtt:g},0" if rtt > 0 else "none"
            r = dmh.shine_measure(images, a.num_cns, wl, work / name / f"rtt{rtt:g}", pol.replace(":", "-"),
                                  routing=routing, cache_ratio=a.cache_ratio, repeats=a.repeats, **f)
            r["load_max_over_mean"] = dmh.load_max_over_mean(r)
            # Cores' worth of CPU the computenodes used over the measured part: near the host's
            # cores (less the memnodes' share), the run is CPU-bound; well below, round-trip-bound.
            cpu = [c.get("cpu_seconds") for c in r["per_cn"]]
            r["cn_cores"] = sum(cpu) / r["seconds"] if r["seconds"] and None not in cpu else None
            res[pol] = r
        per_rtt[f"{rtt:g}"] = res
    results["sets"][name] = {"index": index_info, "rtts": per_rtt}

checks = []
for name, s in results["sets"].items():
    for rtt, res in s["rtts"].items():
        if float(rtt) > 0:
            checks += dmh.adaptive_checks(res, set=name, rtt_us=float(rtt))
dmh.finish_checks(results, checks, t_start)
num = dmh.num

ref_pol = "best-fit" if "best-fit" in policies else policies[0]  # what QPS is divided by
md = [dmh.shine_header_md(a, results)]
for name, s in results["sets"].items():
    first = next(iter(s["rtts"].values()))
    md.append(dmh.cache_md(name, first[policies[0]]))
    rows = []
    for rtt, res in s["rtts"].items():
        for pol in policies:
            r = res[pol]
            ref = res[ref_pol]
            rows.append([rtt, pol, f"{r['qps']:.0f}", "–".join(f"{q:.0f}" for q in (min(r["qps_all"]), max(r["qps_all"]))),
                         num(r["qps"] / ref["qps"] if ref["qps"] else None), dmh.pct(r["chr"]),
                         num(r["load_max_over_mean"]), num(r["cn_cores"]), f"{r['recall']:.4f}"])
    md.append(dmh.md_table(["wire latency (us)", "routing", "QPS (median)", "QPS range", f"QPS / {ref_pol}", "CHR",
                            "busiest cn / mean", "computenode CPU (cores)", "recall@10"], rows))
if checks:
    md.append("\nCheck (with a wire latency only):\n\n")
    md += [f"- {c['set']}, {a.dist}, RTT {c['rtt_us']:g} us: {c['what']}: {c['value']} — "
           f"**{'yes' if c['ok'] else 'NO'}**\n" for c in checks]
md.append("\n![QPS per policy against the wire latency](rtt_sweep.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    sets = list(results["sets"].items())
    fig, axes = plt.subplots(len(sets), 2, figsize=(10, 3.8 * len(sets)), squeeze=False)
    for row, (name, s) in enumerate(sets):
        xs = [float(r) for r in s["rtts"]]
        for pol in policies:
            q = [s["rtts"][r][pol]["qps"] for r in s["rtts"]]
            rel = [s["rtts"][r][pol]["qps"] / s["rtts"][r][ref_pol]["qps"] for r in s["rtts"]]
            axes[row][0].plot(xs, q, marker="o", label=pol)
            axes[row][1].plot(xs, rel, marker="o", label=pol)
        axes[row][0].set_title(f"{name}, {a.dist}: QPS (median of {a.repeats})", fontsize=10)
        axes[row][1].set_title(f"QPS / {ref_pol}'s", fontsize=10)
        for ax in axes[row]:
            ax.set_xlabel("wire latency per remote operation (us)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "rtt_sweep.png", dpi=110)
dmh.write_results(out, results, md)
print(f"check: {'holds' if results['all_ok'] else 'does NOT hold'}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'rtt_sweep.png'}")
