#!/usr/bin/python3
"""d-HNSW recall against b (partitions probed per query) and efSearch (see README.md here).

Per data set (with its number of partitions P): the d-HNSW index is built once by
dhnsw-build (capacity-constrained k-means, M=16, efConstruction=100) under runs/dhnsw/, one
memnode serves it, one computenode runs a uniform workload over the data set's query pool
(no warm-up) once per b, each run trying every efSearch (`--ef-search 16,32,64,128`).
Prints and writes recall@10 and recall@1 per (b, efSearch), then checks the issue's
criterion: recall@10 >= 0.90 on wordnet and bigann10k, naming the smallest settings that
reach it.

  experiments/dhnsw_recall/run.py [--sets wordnet=16,bigann10k=8,syn100k=16] [--probes 1,2,4,8]
      [--ef-search 16,32,64,128] [--batch 1000] [--queries 2000] [--quick]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sets", default="wordnet=16,bigann10k=8,syn100k=16",
                help="data sets and their partitions P, SET=P,... (default %(default)s)")
ap.add_argument("--probes", default="1,2,4,8", help="b values (default %(default)s)")
ap.add_argument("--ef-search", default="16,32,64,128", help="efSearch values (default %(default)s)")
ap.add_argument("--batch", type=int, default=1000, help="B, queries per batch (default %(default)s)")
ap.add_argument("--k", type=int, default=10, help="neighbours per query (default %(default)s)")
ap.add_argument("--queries", type=int, default=2000,
                help="measured queries, drawn uniformly with repetition from the data set's query pool "
                     "(1000 queries; bigann10k: 100), no warm-up (default %(default)s)")
ap.add_argument("--target", type=float, default=0.90, help="criterion: recall@10 >= T (default %(default)s)")
ap.add_argument("--criterion-sets", default="wordnet,bigann10k", help="sets the criterion applies to (default %(default)s)")
dmh.dhnsw_common_args(ap, quick_help="smoke run: bigann10k (P=8), b 1,2, efSearch 16,64, 500 queries; results go "
                                     "to WORK/quick/dhnsw_recall/")
a = ap.parse_args()
if a.quick:
    a.sets, a.probes, a.ef_search, a.queries = "bigann10k=8", "1,2", "16,64", 500
    a.timeout = min(a.timeout, 300)

work, out, t_start, results = dmh.dhnsw_start("dhnsw_recall", a, HERE)
sets = [(s.split("=")[0], int(s.split("=")[1])) for s in a.sets.split(",")]
probes = [int(x) for x in a.probes.split(",")]
efs = [int(x) for x in a.ef_search.split(",")]
results["sets"] = {}
dmh.log(f"dhnsw_recall: {sets}, b {probes}, efSearch {efs}, batch {a.batch}, {a.queries} queries")
for name, P in sets:
    images = dmh.dhnsw_index(name, a.work, P, a.m, a.ef_construction)
    info = dmh.dhnsw_index_info(images)
    wl = dmh.shine_workload(name, dmh.SHINE_WORK, "uniform", a.queries, 0, a.seed)
    s = {"partitions": P, "vectors": info.get("vectors"), "dim": info.get("dim"), "metric": info.get("metric"),
         "index_dir": str(images[0].parent), "workload": str(wl), "runs": []}
    for b in probes:
        t0 = time.time()
        rep = dmh.dhnsw_query(images, 1, wl, work / "recall" / name / f"p{P}_b{b}.json", k=a.k, batch=a.batch,
                              probe=b, ef_search=efs, provider=a.provider, wire=a.wire, region=a.region, timeout=a.timeout)
        for r in rep["runs"]:
            x = dmh.dhnsw_run_summary(r)
            x["probe"] = b
            s["runs"].append(x)
            dmh.log(f"  {name} P={P} b={b} efSearch={x['ef_search']}: recall@10 {x['recall']:.4f}, recall@1 "
                    f"{x['recall_at_1']:.4f}, {x['total_us']:.0f} us/query")
        dmh.log(f"  ({time.time() - t0:.0f} s)")
    results["sets"][name] = s

# ---- criterion: recall@10 >= target; the smallest (b, efSearch) and the fastest setting reaching it
checks = []
for name, s in results["sets"].items():
    ok_runs = [r for r in s["runs"] if r["recall"] >= a.target]
    best = max(s["runs"], key=lambda r: r["recall"])
    if ok_runs:
        small = min(ok_runs, key=lambda r: (r["probe"], r["ef_search"]))
        fast = min(ok_runs, key=lambda r: r["total_us"])
        per_b = {b: min((r["ef_search"] for r in ok_runs if r["probe"] == b), default=None) for b in probes}
        s["reach"] = {"smallest": [small["probe"], small["ef_search"]], "fastest": [fast["probe"], fast["ef_search"]],
                      "per_probe": per_b}
        value = (f"smallest b={small['probe']}, efSearch={small['ef_search']} (recall@10 {small['recall']:.4f}); "
                 f"fastest b={fast['probe']}, efSearch={fast['ef_search']} ({fast['recall']:.4f}, "
                 f"{fast['total_us']:.0f} us/query); smallest efSearch per b: " +
                 ", ".join(f"b={b}: {e if e else '—'}" for b, e in per_b.items()))
    else:
        s["reach"] = None
        value = f"no setting; best recall@10 {best['recall']:.4f} (b={best['probe']}, efSearch={best['ef_search']})"
    checks.append({"set": name, "what": f"recall@10 >= {a.target:.2f}", "value": value, "ok": bool(ok_runs),
                   "criterion": name in a.criterion_sets.split(",")})
results["checks"] = checks
results["all_ok"] = all(c["ok"] for c in checks if c["criterion"])
results["seconds"] = time.time() - t_start

# ---- tables
md = [f"Run {results['date']} ({results['seconds'] / 60:.1f} min): `{results['command']}`\n\n"
      f"1 memnode (`{a.provider}`, wire {a.wire}), 1 computenode, M={a.m}, efConstruction={a.ef_construction}, batch {a.batch}, "
      f"cache 10 % of the partitions (default), k={a.k}, {a.queries} measured queries drawn uniformly from the "
      f"query pool (seed {a.seed}), no warm-up. Latency: wall time per query (pipelined), including the cold "
      f"cache of the first efSearch of each b.\n"]
for name, s in results["sets"].items():
    md.append(f"\n**{name}** ({s['vectors']} vectors x {s['dim']}, {s['metric']}, P={s['partitions']}): recall@10 "
              f"(recall@1) per b and efSearch\n\n")
    rows = []
    for b in probes:
        row = [f"b={b}"]
        for ef in efs:
            r = next(r for r in s["runs"] if r["probe"] == b and r["ef_search"] == ef)
            mark = "**" if r["recall"] >= a.target else ""
            row.append(f"{mark}{r['recall']:.4f}{mark} ({r['recall_at_1']:.3f})")
        rows.append(row)
    md.append(dmh.md_table(["b \\ efSearch"] + [str(e) for e in efs], rows))
    md.append("\nus per query (pipelined wall time):\n\n")
    rows = [[f"b={b}"] + [f"{next(r for r in s['runs'] if r['probe'] == b and r['ef_search'] == ef)['total_us']:.0f}"
                          for ef in efs] for b in probes]
    md.append(dmh.md_table(["b \\ efSearch"] + [str(e) for e in efs], rows))
md.append(f"\nCriterion (recall@10 >= {a.target:.2f} on {a.criterion_sets}; bold above):\n\n")
md += [f"- {c['set']}: {c['value']} — **{'yes' if c['ok'] else 'NO'}**" + ("" if c["criterion"] else " (not part of the criterion)") + "\n"
       for c in checks]
md.append("\n![recall@10 vs b](dhnsw_recall.png)\n")
md = "".join(md)
print("\n" + md)

plt = dmh.pyplot()
if plt is not None:
    names = list(results["sets"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.6 * len(names), 7), squeeze=False)
    for col, name in enumerate(names):
        s = results["sets"][name]
        for row, (key, label) in enumerate([("recall", "recall@10"), ("recall_at_1", "recall@1")]):
            ax = axes[row][col]
            for i, ef in enumerate(efs):
                rs = sorted((r for r in s["runs"] if r["ef_search"] == ef), key=lambda r: r["probe"])
                ax.plot([r["probe"] for r in rs], [r[key] for r in rs], "o-", color=f"C{i}", label=f"efSearch {ef}")
            if key == "recall":
                ax.axhline(a.target, color="0.5", ls="--", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_xticks(probes)
            ax.set_xticklabels([str(b) for b in probes])
            ax.set_xlabel("b (partitions probed per query)")
            ax.set_ylabel(label)
            ax.set_title(f"{name} (P={s['partitions']}): {label}", fontsize=10)
            ax.grid(True, alpha=0.3)
        axes[0][col].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "dhnsw_recall.png", dpi=110)
dmh.dhnsw_finish(out, HERE, results, md)
print(f"criterion: {'holds' if results['all_ok'] else 'does NOT hold'}; wrote {out / 'results.json'}, "
      f"{out / 'results.md'}, {out / 'dhnsw_recall.png'} ({results['seconds']:.0f} s)")
