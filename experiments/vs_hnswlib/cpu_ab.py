#!/usr/bin/python3
"""CPU per query on one graph: computenode binaries against hnswlib, robust to other load.

QPS on this host moves by up to 30 % between runs, and more while anything else runs. The CPU
time a process spends (user + system, from wait4) moves far less, and on one graph the work
of a search is the same in every binary: the distances are hnswlib's own. So hnswlib's saved
index (vs_hnswlib/run.py's WORK/hnswlib.idx) is imported into 2 memnodes over cxl
(`shine-import`: hnswlib's graph as shine records), and each binary, then `hnswlib-bench
--load`, answers the workload twice per round, at the first --ef-search value alone and at all
of them; the difference is the CPU of the other values' queries without start-up, loading or
connecting. Rounds alternate the order. Prints each round and the median CPU of each, with
hnswlib's CPU over each binary's (1.0: as cheap as hnswlib per query).

With --build: CPU of a whole 1-thread build process (start-up included) of each binary, each
into fresh memnodes.

  cp build/bin/computenode /tmp/computenode.old   # then change, build
  experiments/vs_hnswlib/cpu_ab.py --work runs/vs_hnswlib/bigann10k \\
      --base /work/shared/data/bigann10k/bigann10k_base.bvecs --bins /tmp/computenode.old,build/bin/computenode
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--bins", required=True, help="comma list of computenode binaries")
ap.add_argument("--work", required=True, help="a vs_hnswlib/run.py work folder: uniform.wl, hnswlib.idx, hnswlib.json "
                "and base.fvecs (syn sets) or --base")
ap.add_argument("--base", default=None, help="the base vectors (default WORK/base.fvecs)")
ap.add_argument("--ef-search", default="16,32,64,128", help="efSearch values; the first is the baseline run "
                "(default %(default)s)")
ap.add_argument("--rounds", type=int, default=4, help="(default %(default)s)")
ap.add_argument("--region", default="1GiB", help="each of the 2 memnodes' region (default %(default)s)")
ap.add_argument("--build", action="store_true", help="compare 1-thread builds instead")
a = ap.parse_args()
work = Path(a.work)
base = Path(a.base) if a.base else work / "base.fvecs"
wl = work / "uniform.wl"
bins = [str(Path(b).resolve()) for b in a.bins.split(",")]
for f in [base, wl, work / "hnswlib.json", work / "hnswlib.idx"] + [Path(b) for b in bins]:
    if not f.exists():
        sys.exit(f"cpu_ab.py: {f} does not exist")
ref = json.loads((work / "hnswlib.json").read_text())
graph = ["--m", ref["m"], "--ef-construction", ref["ef_construction"], "--metric", ref["metric"]]
report = work / "cpu_ab.json"


def cpu(cmd):
    """CPU seconds (user + system) of one process run to its end."""
    env = dmh.reference_env() if Path(str(cmd[0])).name == "hnswlib-bench" else dmh.quiet_blas_env()
    p = subprocess.Popen([str(x) for x in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"cpu_ab.py: {' '.join(str(x) for x in cmd)} failed (status {status})")
    return ru.ru_utime + ru.ru_stime


def recalls():
    return [round(x["recall"], 4) for x in json.loads(report.read_text())["runs"]]


def name(b):
    return Path(b).name


def order(r, names):
    return names if r % 2 == 0 else names[::-1]


if a.build:
    out = {b: [] for b in bins}
    for r in range(a.rounds):
        for b in order(r, bins):
            with dmh.Memnodes(2, "cxl", a.region, work / "cpu_ab_mn") as mn:
                out[b].append(cpu([b, "--memnodes", mn.list, "--provider", "cxl", "build", "--data", base,
                                   "--threads", 1] + graph))
        print(f"round {r}", {name(b): round(v[-1], 3) for b, v in out.items()}, flush=True)
    for b, v in out.items():
        print(f"{name(b):28} median build CPU s {statistics.median(v):.3f}")
    sys.exit(0)

first = a.ef_search.split(",")[0]
names = bins + ["hnswlib"]
out = {n: [] for n in names}
with dmh.Memnodes(2, "cxl", a.region, work / "cpu_ab_mn") as mn:
    dmh.run([dmh.BIN / "shine-import", "--hnswlib", work / "hnswlib.idx", "--metric", ref["metric"], "--data", base,
             "--memnodes", mn.list, "--provider", "cxl"])
    for r in range(a.rounds):
        got = {}
        for n in order(r, names):
            c = {}
            for efs in (first, a.ef_search):
                if n == "hnswlib":
                    c[efs] = cpu([dmh.BIN / "hnswlib-bench", "--base", base, "--load", work / "hnswlib.idx",
                                  "--workload", wl, "--ef-search", efs, "--k", 10, "--threads", 1, "--json", report] + graph)
                else:
                    c[efs] = cpu([n, "--memnodes", mn.list, "--provider", "cxl", "query", "--workload", wl,
                                  "--ef-search", efs, "--k", 10, "--threads", 1, "--coroutines", 4, "--report", report])
                got[n] = recalls()
            out[n].append(c[a.ef_search] - c[first])
        print(f"round {r}", {name(n): round(v[-1], 3) for n, v in out.items()},
              "recall", {name(n): x for n, x in got.items()}, flush=True)
h = statistics.median(out["hnswlib"])
for n in names:
    m = statistics.median(out[n])
    print(f"{name(n):28} median CPU s {m:.3f}  hnswlib's / this {h / m:.3f}")
