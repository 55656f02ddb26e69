#!/usr/bin/python3
"""Two computenode binaries against each other on one shine index, hnswlib beside them.

On this host QPS moves by up to 30 % between runs of one command, as much as a step of the
search's code. So the two binaries (OLD and NEW: a copy of build/bin/computenode made before
a change, and the one after it) query the same index in the same memnodes, in alternating
order, round after round, and hnswlib's saved index of the same data (vs_hnswlib/run.py's
WORK/hnswlib.idx) is searched between them. Each query process runs every --ef-search value
(repeat one to get several points per process). Prints recall and QPS per run and the median
QPS of each binary and of hnswlib per efSearch and round, with the ratio to hnswlib.

With --dhnsw DIR, both binaries query the d-HNSW index whose images run.py left in DIR
(WORK/dhnsw: index.img.0 and .1, served by 2 fresh memnodes) with --probe and --batch.

With --build, the builds are compared instead: each round, each binary builds the index into
fresh memnodes and queries it, and hnswlib builds its own; prints inserts/s and recall per
build and the ratio to hnswlib's inserts/s in the same round.

  cp build/bin/computenode /tmp/computenode.old   # then change, build
  experiments/vs_hnswlib/ab.py --old /tmp/computenode.old --work runs/vs_hnswlib/syn1000k \\
      --ef-search 64,64,64,256,256
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--old", required=True, help="the computenode binary before the change")
ap.add_argument("--new", default=str(dmh.BIN / "computenode"), help="the one after it (default %(default)s)")
ap.add_argument("--work", required=True, help="a vs_hnswlib/run.py work folder: uniform.wl, hnswlib.idx and "
                "hnswlib.json (its M, efConstruction and metric, which shine's build takes too), and base.fvecs "
                "(syn sets) or --base")
ap.add_argument("--base", default=None, help="the base vectors (default WORK/base.fvecs)")
ap.add_argument("--ef-search", default="64,64,64,256,256", help="efSearch values of every process "
                "(default %(default)s)")
ap.add_argument("--rounds", type=int, default=2, help="rounds: each binary once, then hnswlib (default %(default)s)")
ap.add_argument("--region", default="2GiB", help="each of the 2 memnodes' region (default %(default)s)")
ap.add_argument("--threads", type=int, default=2, help="threads everywhere (default %(default)s)")
ap.add_argument("--build", action="store_true", help="compare the builds (each binary builds its own index)")
ap.add_argument("--old-args", default="", help="more query flags of the old binary, e.g. \"--no-in-place\" (one binary "
                "against itself with other flags: --old build/bin/computenode)")
ap.add_argument("--new-args", default="", help="more query flags of the new binary")
ap.add_argument("--dhnsw", default=None, help="query the d-HNSW index in this run.py folder (WORK/dhnsw) instead of a "
                "shine build")
ap.add_argument("--probe", type=int, default=4, help="--dhnsw: partitions searched per query (default %(default)s)")
ap.add_argument("--batch", type=int, default=1000, help="--dhnsw: queries per batch (default %(default)s)")
a = ap.parse_args()
work = Path(a.work)
base = Path(a.base) if a.base else work / "base.fvecs"
wl = work / "uniform.wl"
saved = [] if a.build else [work / "hnswlib.idx"]  # --build: hnswlib builds its own
for f in [base, wl, work / "hnswlib.json", Path(a.old), Path(a.new)] + saved:
    if not f.exists():
        sys.exit(f"ab.py: {f} does not exist")
ref = json.loads((work / "hnswlib.json").read_text())  # the saved index's build (its file does not say the metric)
graph = ["--m", ref["m"], "--ef-construction", ref["ef_construction"], "--metric", ref["metric"]]
common = ["--workload", wl, "--ef-search", a.ef_search, "--k", 10, "--threads", a.threads]
runs = {"old": [], "new": [], "hnswlib": []}


def points(report):
    return [(x["ef_search"], x["recall"], x["qps"]) for x in json.loads(Path(report).read_text())["runs"]]


def order(r):
    """Which binary goes first in round r: they alternate."""
    return ("old", "new") if r % 2 == 0 else ("new", "old")


def shown(pts):
    return " ".join(f"{ef}:{rc:.4f}/{q:,.0f}" for ef, rc, q in pts)


if a.build:
    builds = {"old": [], "new": [], "hnswlib": []}  # (inserts/s, [(efSearch, recall, QPS)])
    for r in range(a.rounds):
        for name in order(r):
            with dmh.Memnodes(2, "cxl", a.region, work / "ab_mn") as mn:
                cm = ["--memnodes", mn.list, "--provider", "cxl"]
                b, q = work / f"ab_build_{name}.json", work / f"ab_{name}.json"
                dmh.run([getattr(a, name)] + cm + ["build", "--data", base, "--threads", a.threads, "--report", b] + graph,
                        env=dmh.quiet_blas_env())
                dmh.run([getattr(a, name)] + cm + ["query", "--coroutines", 4, "--report", q] + common, env=dmh.quiet_blas_env())
                builds[name].append((json.loads(b.read_text())["inserts_per_s"], points(q)))
        hj = work / "ab_hnswlib_build.json"
        dmh.run([dmh.BIN / "hnswlib-bench", "--base", base, "--json", hj] + graph + common, env=dmh.reference_env())
        h = json.loads(hj.read_text())
        builds["hnswlib"].append((h["n"] / h["build_seconds"], points(hj)))
        for name in ("old", "new", "hnswlib"):
            ips, pts = builds[name][-1]
            print(f"round {r} {name:8} {ips:,.0f} inserts/s ({ips / builds['hnswlib'][-1][0]:.2f}x hnswlib); recall/QPS",
                  shown(pts), flush=True)
    sys.exit(0)

images = [Path(a.dhnsw) / f"index.img.{i}" for i in range(2)] if a.dhnsw else None
with dmh.Memnodes(None if images else 2, "cxl", a.region, work / "ab_mn", load=images) as mn:
    cm = ["--memnodes", mn.list, "--provider", "cxl"]
    if images:
        cm = ["--mode", "dhnsw"] + cm
        query = ["query", "--probe", a.probe, "--batch", a.batch]
    else:
        dmh.log(f"shine build of {base} (the new binary)")
        dmh.run([a.new] + cm + ["build", "--data", base, "--threads", a.threads] + graph)
        query = ["query", "--coroutines", 4]
    for r in range(a.rounds):
        for name in order(r):
            rep = work / f"ab_{name}.json"
            dmh.run([getattr(a, name)] + cm + query + ["--report", rep] + common + getattr(a, name + "_args").split(),
                    env=dmh.quiet_blas_env())
            runs[name].append(points(rep))
        hj = work / "ab_hnswlib.json"
        dmh.run([dmh.BIN / "hnswlib-bench", "--base", base, "--load", work / "hnswlib.idx", "--json", hj] + graph + common,
                env=dmh.reference_env())
        runs["hnswlib"].append(points(hj))
        for name in ("old", "new", "hnswlib"):
            print(f"round {r} {name:8}", shown(runs[name][-1]), flush=True)

print("\nmedian QPS per round (x hnswlib's in the same round):")
for ef in sorted({p[0] for p in runs["hnswlib"][0]}):
    for name in ("old", "new"):
        cells = []
        for mine, ref in zip(runs[name], runs["hnswlib"]):
            m = statistics.median(q for e, _, q in mine if e == ef)
            h = statistics.median(q for e, _, q in ref if e == ef)
            cells.append(f"{m:,.0f} ({m / h:.2f}x)")
        print(f"efSearch {ef:5} {name}: " + ", ".join(cells))
