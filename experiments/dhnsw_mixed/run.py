#!/usr/bin/python3
"""d-HNSW under mixed search/insert workloads (see README.md): paper Figures 13 and 18.

On wordnet-minilm-384 (the first 40,000 rows indexed, the other 10,000 inserted), 2 memnodes
over shm:

  A (Figure 13): one computenode runs batches of --batch operations with 0..50 % inserts for
    --seconds each (a fresh index per point); batch latency, search QPS, inserts/s.
  B (Figure 18): one computenode with 20 % inserts (it becomes the rebuild master) and two that
    only search, for --window seconds with small gaps so that rebuilds happen in the window;
    throughput of all three over time, with the epochs.

  experiments/dhnsw_mixed/run.py [--seconds 15] [--window 60] [--batch 1000]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
WN = dmh.DATA / "wordnet-minilm-384"
BASE = WN / "base.fvecs"
BUILT = 40000

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--seconds", type=float, default=15, help="length of each point of A")
ap.add_argument("--window", type=float, default=60, help="length of B")
ap.add_argument("--batch", type=int, default=1000)
ap.add_argument("--probe", type=int, default=4)
ap.add_argument("--shares", default="0,0.1,0.2,0.3,0.4,0.5")
ap.add_argument("--out", default=str(HERE))
ap.add_argument("--from", dest="from_dir", help="no runs: tabulate and plot the reports of an earlier run's work dir")
args = ap.parse_args()
work = Path(args.from_dir) if args.from_dir else Path(dmh.tempfile.mkdtemp(prefix="dhnsw-mixed-"))
wl = work / "q.wl"
if not args.from_dir:
    dmh.run([dmh.BIN / "workload", "--queries", WN / "query.fvecs", "--groundtruth", WN / "groundtruth.ivecs", "--dist",
             "uniform", "--count", 1000, "--warmup", 0, "--seed", 1, "--out", wl])


def cn(mn, cn_id, num, *rest):
    return [str(x) for x in [dmh.BIN / "computenode", "--mode", "dhnsw", "--provider", "shm", "--memnodes", mn.list,
                             "--cn-id", cn_id, "--num-cns", num, *rest]]


def build(mn, gaps):
    dmh.run(cn(mn, 0, 1, "build", "--data", BASE, "--max-elements", BUILT, "--metric", "ip", "--internal-gap", gaps,
               "--overflow-gap", gaps))


def mixed(mn, cn_id, num, share, seconds, report):
    return cn(mn, cn_id, num, "query", "--workload", wl, "--k", 10, "--batch", args.batch, "--probe", args.probe,
              "--ef-search", 64, "--mix", f"insert:{share}", "--insert-data", BASE, "--insert-begin", BUILT,
              "--repeat-seconds", seconds, "--report", report)


results = {"data": str(WN), "built": BUILT, "batch": args.batch, "probe": args.probe, "A": [], "B": {}}
for share in [float(x) for x in args.shares.split(",")]:
    rep = work / f"a{share}.json"
    if not args.from_dir:
        with dmh.Memnodes(2, "shm", region="1GiB", workdir=work / f"a{share}") as mn:
            build(mn, 0.10)
            dmh.run(mixed(mn, 0, 1, share, args.seconds, rep))
    r = json.loads(rep.read_text())
    results["A"].append({"insert_share": share, "batch_ms": r["batch_ms"], "search_qps": r["search"]["qps"],
                         "recall": r["search"]["recall"], "inserts_per_s": r["insert"]["inserted"] / r["seconds"],
                         "rebuilds": r["insert"]["rebuilds"], "ops_per_s": r["ops_per_s"],
                         "per_insert": r["insert"]["per_insert"]})
    dmh.log(f"A {share:.0%}: batch p50 {r['batch_ms']['p50']:.0f} ms, {r['ops_per_s']:.0f} ops/s")

if not args.from_dir:
    with dmh.Memnodes(2, "shm", region="2GiB", workdir=work / "b") as mn:
        build(mn, 0.02)
        procs = []
        for i, share in enumerate([0.2, 0.0, 0.0]):
            log = open(work / f"b{i}.log", "w")
            procs.append(subprocess.Popen(mixed(mn, i, 3, share, args.window, work / "b.json"), stdout=log, stderr=log))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"B: a computenode failed ({codes}); see {work}/b*.log")
runs = [json.loads((work / f"b.json.cn{i}").read_text()) for i in range(3)]
# Operations per second of all three, per 2 s bin, and the newest epoch any of them used.
width = 2.0
bins = {}
for r in runs:
    for t, ni, nq, _, _, epoch in r["timeline"]:
        b = int(t // width)
        x = bins.setdefault(b, {"ops": 0, "inserts": 0, "epoch": 0})
        x["ops"] += ni + nq
        x["inserts"] += ni
        x["epoch"] = max(x["epoch"], epoch)
series, epoch = [], 1
for b, v in sorted(bins.items()):
    epoch = max(epoch, v["epoch"])
    series.append({"t_s": b * width, "ops_per_s": v["ops"] / width, "inserts_per_s": v["inserts"] / width,
                   "epoch": epoch})
results["B"] = {"series": series, "rebuilds": runs[0]["insert"]["rebuilds"],
                "rebuild_reports": runs[0]["insert"]["rebuild_reports"],
                "search_qps": [r["search"]["qps"] for r in runs], "recall": [r["search"]["recall"] for r in runs],
                "inserted": runs[0]["insert"]["inserted"], "buffered": runs[0]["insert"]["buffered"]}

out = Path(args.out)
(out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
md = ["| inserts | batch p50 (ms) | batch mean (ms) | batch p99 (ms) | ops/s | search QPS | R@10 | inserts/s | rebuilds |",
      "|---|---|---|---|---|---|---|---|---|"]
for a in results["A"]:
    md.append(f"| {a['insert_share']:.0%} | {a['batch_ms']['p50']:.0f} | {a['batch_ms']['mean']:.0f} | "
              f"{a['batch_ms']['p99']:.0f} | {a['ops_per_s']:.0f} | {a['search_qps']:.0f} | {a['recall']:.3f} | "
              f"{a['inserts_per_s']:.0f} | {a['rebuilds']} |")
b = results["B"]
md += ["", f"B: {b['inserted']} inserts by computenode 0 ({b['buffered']} into the buffer during rebuilds), "
           f"{b['rebuilds']} rebuilds; search QPS per computenode " + ", ".join(f"{x:.0f}" for x in b["search_qps"]),
       "", "| t (s) | ops/s (all three) | inserts/s | epoch |", "|---|---|---|---|"]
md += [f"| {s['t_s']:.0f} | {s['ops_per_s']:.0f} | {s['inserts_per_s']:.0f} | {s['epoch']} |" for s in b["series"]]
(out / "results.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
plt = dmh.pyplot()
if plt:
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].bar([f"{a['insert_share']:.0%}" for a in results["A"]], [a["batch_ms"]["mean"] for a in results["A"]])
    ax[0].set_xlabel("inserts in the batch")
    ax[0].set_ylabel(f"batch latency, mean (ms), batch {args.batch}")
    ax[0].set_title("A: mixed batches (paper Fig. 13)")
    ts = [s["t_s"] for s in b["series"]]
    ax[1].plot(ts, [s["ops_per_s"] for s in b["series"]], label="ops/s, all computenodes")
    ax[1].plot(ts, [s["inserts_per_s"] for s in b["series"]], label="inserts/s")
    for i in range(1, len(b["series"])):
        if b["series"][i]["epoch"] != b["series"][i - 1]["epoch"]:
            ax[1].axvline(ts[i], color="grey", ls=":", lw=1)
    ax[1].set_xlabel("time (s); dotted: a new epoch")
    ax[1].set_title("B: 20 % inserts on 1 of 3 computenodes (paper Fig. 18)")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(out / "dhnsw_mixed.png", dpi=110)
print(f"work dir: {work}")
