#!/usr/bin/python3
"""d-HNSW pipeline latency breakdown, like Figure 16 of the d-HNSW paper (see README.md here).

On syn100k with P=16 partitions (6250 vectors each), efSearch 32, for each probe b and batch
size B: one memnode and one computenode run the workload pipelined (fetch, deserialize and
search on their own threads, overlapping) and with --no-pipeline (the stages of each batch in
sequence: the "individually measured" stage times). Per run: the busy time of each stage
(meta-HNSW search, RDMA fetch, deserialize, sub-HNSW search) per query, their sum, and the
wall time per query (stages_us.pipelined_total). REPEATS runs per point, median by wall time.
Criterion (batches >= 1000): pipelined wall time <= 0.7 x the sum of the stage times, stated
against both the pipelined run's own stage sum and the sequential run's. A third run per point
(--pipelined-search-threads N, default 1; 0: none) pipelines with --search-threads N (the
engine searches on every core by default; until commit 9f7a4a7 it used cores - 1 when
pipelined).

  experiments/dhnsw_breakdown/run.py [--partitions 16] [--probes 1,2] [--batches 250,500,1000,2000]
      [--queries 8000] [--warmup 2000] [--repeats 3] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
PST = "pipelined-st"  # the pipelined run with --search-threads N
STAGES = [("meta", "meta-HNSW"), ("fetch", "fetch"), ("deserialize", "deserialize"), ("search", "sub-HNSW search")]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="syn100k", help="data set (default %(default)s)")
ap.add_argument("--partitions", type=int, default=16, help="P (default %(default)s)")
ap.add_argument("--probes", default="1,2", help="b values (default %(default)s)")
ap.add_argument("--ef-search", type=int, default=32, help="efSearch (default %(default)s)")
ap.add_argument("--batches", default="250,500,1000,2000", help="B values (default %(default)s)")
ap.add_argument("--queries", type=int, default=8000, help="measured queries (default %(default)s)")
ap.add_argument("--warmup", type=int, default=2000, help="warm-up queries (default %(default)s)")
ap.add_argument("--repeats", type=int, default=3, help="runs per point, median wall time (default %(default)s)")
ap.add_argument("--factor", type=float, default=0.7, help="criterion: pipelined <= F x sum (default %(default)s)")
ap.add_argument("--pipelined-search-threads", type=int, default=1,
                help="also run the pipelined engine with --search-threads N (by default it searches on every core; "
                     "up to commit 9f7a4a7 it searched on cores - 1 = 1 thread, leaving a core to fetching and "
                     "deserializing); 0: not (default %(default)s)")
ap.add_argument("--criterion-min-batch", type=int, default=1000, help="the criterion applies to B >= this (default %(default)s)")
dmh.dhnsw_common_args(ap, quick_help="smoke run: b=2, B 500,1000, 2000 + 500 warm-up queries, 1 run each; results "
                                     "go to WORK/quick/dhnsw_breakdown/")
a = ap.parse_args()
if a.quick:
    a.probes, a.batches, a.queries, a.warmup, a.repeats = "2", "500,1000", 2000, 500, 1
    a.timeout = min(a.timeout, 300)

work, out, t_start, results = dmh.dhnsw_start("dhnsw_breakdown", a, HERE)
probes = [int(x) for x in a.probes.split(",")]
Bs = [int(x) for x in a.batches.split(",")]
images = dmh.dhnsw_index(a.set, a.work, a.partitions, a.m, a.ef_construction)
info = dmh.dhnsw_index_info(images)
results["index"] = {"dir": str(images[0].parent), "partitions": a.partitions, "partition_vectors": info["partitions"]["mean"]}
wl = dmh.shine_workload(a.set, dmh.SHINE_WORK, "uniform", a.queries, a.warmup, a.seed)
results["points"] = []
MODES = [("pipelined", True, []), ("sequential", False, [])]
if a.pipelined_search_threads:
    MODES.append((PST, True, ["--search-threads", a.pipelined_search_threads]))
dmh.log(f"dhnsw_breakdown: {a.set} P={a.partitions}, b {probes}, B {Bs}, efSearch {a.ef_search}, {a.warmup} + "
        f"{a.queries} queries, {a.repeats} run(s) each")
for b in probes:
    for B in Bs:
        pt = {"probe": b, "batch": B}
        for mode, pipeline, extra in MODES:
            t0 = time.time()
            x = dmh.dhnsw_measure(images, wl, work / "breakdown" / f"b{b}_B{B}_{mode}", a.repeats, batch=B, probe=b,
                                  ef_search=a.ef_search, pipeline=pipeline, extra=extra, provider=a.provider, wire=a.wire,
                                  region=a.region, timeout=a.timeout)
            pt[mode] = x
            st = x["stages_us"]
            dmh.log(f"  b={b} B={B} {mode}: wall {x['total_us']:.1f} us/query (all {[round(v) for v in x['total_us_all']]}), "
                    f"stages {', '.join(f'{k} {st[k]:.1f}' for k, _ in STAGES)}, sum {st['sum']:.1f} "
                    f"({time.time() - t0:.0f} s)")
        p, s = pt["pipelined"], pt["sequential"]
        pt["wall_over_own_sum"] = p["total_us"] / p["stages_us"]["sum"]
        pt["wall_over_seq_sum"] = p["total_us"] / s["stages_us"]["sum"]
        if PST in pt:
            pt["st_wall_over_own_sum"] = pt[PST]["total_us"] / pt[PST]["stages_us"]["sum"]
            pt["st_wall_over_seq_sum"] = pt[PST]["total_us"] / s["stages_us"]["sum"]
        results["points"].append(pt)

checks = []
for pt in results["points"]:
    if pt["batch"] < a.criterion_min_batch:
        continue
    p, s = pt["pipelined"], pt["sequential"]
    for which, total, ratio in (("its own stage sum", p["stages_us"]["sum"], pt["wall_over_own_sum"]),
                                ("the sequential run's stage sum", s["stages_us"]["sum"], pt["wall_over_seq_sum"])):
        checks.append({"probe": pt["probe"], "batch": pt["batch"], "against": which,
                       "value": f"{p['total_us']:.1f} us vs {total:.1f} us = {ratio:.2f} x", "ok": ratio <= a.factor})
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks)
results["seconds"] = time.time() - t_start

md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min): `{results['command']}`\n\n"
      f"{a.set}, P={a.partitions} ({info['partitions']['mean']:.0f} vectors per partition), 1 memnode (`{a.provider}`, wire {a.wire}), "
      f"1 computenode (2 cores; the sub-HNSW search uses both unless `--search-threads` says otherwise), M={a.m}, efConstruction={a.ef_construction}, efSearch={a.ef_search}, cache 10 % "
      f"of the partitions, {a.warmup} warm-up + {a.queries} measured queries, uniform (seed {a.seed}), median of "
      f"{a.repeats} run(s) by wall time. All numbers in us per query: stage busy times, their sum, and the wall "
      f"time (`pipelined_total`).\n\n"]
rows = []
for pt in results["points"]:
    for mode in [m for m in ("sequential", "pipelined", PST) if m in pt]:
        x = pt[mode]
        st = x["stages_us"]
        label = f"pipelined, `--search-threads {a.pipelined_search_threads}`" if mode == PST else mode
        rows.append([pt["probe"], pt["batch"], label] + [f"{st[k]:.1f}" for k, _ in STAGES] +
                    [f"{st['sum']:.1f}", f"**{x['total_us']:.1f}**", " / ".join(f"{v:.0f}" for v in x["total_us_all"]),
                     f"{x['total_us'] / st['sum']:.2f}",
                     f"{x['total_us'] / pt['sequential']['stages_us']['sum']:.2f}" if mode != "sequential" else "",
                     f"{x['recall']:.4f}"])
md.append(dmh.md_table(["b", "B", "run", "meta", "fetch", "deser.", "search", "sum", "wall", "runs (wall)",
                        "wall / own sum", "wall / sequential sum", "recall@10"], rows))
md.append(f"\nCriterion (B >= {a.criterion_min_batch}: pipelined wall time <= {a.factor} x the stage sum):\n\n")
md += [f"- b={c['probe']}, B={c['batch']}, against {c['against']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**\n"
       for c in checks]
if a.pipelined_search_threads:
    md.append(f"\nFor comparison, the pipelined engine with `--search-threads {a.pipelined_search_threads}` (B >= "
              f"{a.criterion_min_batch}): " + "; ".join(
                  f"b={pt['probe']}, B={pt['batch']}: {pt[PST]['total_us']:.1f} us = {pt['st_wall_over_own_sum']:.2f} x "
                  f"its own sum, {pt['st_wall_over_seq_sum']:.2f} x the sequential sum"
                  for pt in results["points"] if pt["batch"] >= a.criterion_min_batch) + ".\n")
md.append("\n![stage times and pipelined wall time](dhnsw_breakdown.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    fig, axes = plt.subplots(1, len(probes), figsize=(6.5 * len(probes), 4.8), squeeze=False)
    colors = ["C7", "C0", "C1", "C2"]
    for col, b in enumerate(probes):
        ax = axes[0][col]
        pts = [pt for pt in results["points"] if pt["probe"] == b]
        for j, pt in enumerate(pts):
            for off, mode, hatch in ((-0.2, "sequential", None), (0.2, "pipelined", "//")):
                st, bottom = pt[mode]["stages_us"], 0
                for i, (k, label) in enumerate(STAGES):
                    ax.bar(j + off, st[k], 0.38, bottom=bottom, color=colors[i], hatch=hatch, edgecolor="white",
                           label=label if (j == 0 and mode == "sequential") else None)
                    bottom += st[k]
                ax.text(j + off, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=7)
            w = pt["pipelined"]["total_us"]
            ax.plot([j + 0.01, j + 0.39], [w, w], color="C3", lw=2.5, label="pipelined wall time" if j == 0 else None)
            ax.text(j + 0.2, w, f"{w:.0f}", ha="center", va="top", fontsize=7, color="C3")
            ws = pt["sequential"]["total_us"]
            ax.plot([j - 0.39, j - 0.01], [ws, ws], color="k", lw=1.2, ls=":",
                    label="sequential wall time" if j == 0 else None)
            if PST in pt:
                w2 = pt[PST]["total_us"]
                ax.plot([j + 0.01, j + 0.39], [w2, w2], color="C4", lw=1.8, ls="--",
                        label=f"pipelined wall time, --search-threads {a.pipelined_search_threads}" if j == 0 else None)
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([f"B={pt['batch']}\nseq. | pipe." for pt in pts], fontsize=8)
        ax.set_ylabel("us per query")
        ax.set_title(f"{a.set} P={a.partitions}, b={b}, efSearch {a.ef_search}: stage busy times\n"
                     f"(left: sequential run, right hatched: pipelined run) and pipelined wall time", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        top = max(max(pt[m]["stages_us"]["sum"] for m in ("sequential", "pipelined")) for pt in pts)
        ax.set_ylim(0, 1.45 * top)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "dhnsw_breakdown.png", dpi=110)
dmh.dhnsw_finish(out, HERE, results, md)
print(f"criterion: {'holds' if results['all_ok'] else 'does NOT hold everywhere'}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'dhnsw_breakdown.png'} ({results['seconds']:.0f} s)")
