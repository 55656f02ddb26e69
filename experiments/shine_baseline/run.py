#!/usr/bin/env python3
"""shine mode against single-machine hnswlib on the same machine (see README.md here).

One shine index on 2 memnodes (shm), queried by one computenode with T threads x C
coroutines, in both read modes (one READ per neighbour, as in the paper, and one doorbell
batch per candidate); hnswlib built with the same M/efConstruction and queried with the same
threads and efSearch. Prints per efSearch: recall of both, QPS of both and their ratio,
bytes per query against visited nodes x vector size, READs and doorbells per query.

  experiments/shine_baseline/run.py [--set bigann10k] [--ef 20,40,80] [--threads 2] [--coroutines 4]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--set", default="bigann10k")
ap.add_argument("--ef", default="20,40,80")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--coroutines", type=int, default=4)
ap.add_argument("--m", type=int, default=16)
ap.add_argument("--ef-construction", type=int, default=200)
ap.add_argument("--seconds", type=float, default=5, help="each shine query run repeats the workload this long")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_baseline"))
a = ap.parse_args()

work = Path(a.work)
base, wl, metric = dmh.dataset(a.set, work)
with dmh.Memnodes(2, "shm", "1GiB", work / "mn") as mn:
    build, _ = dmh.computenodes(mn, "shm", 1, "build", ["--data", base, "--m", a.m, "--ef-construction",
                                                          a.ef_construction, "--metric", metric, "--threads", 2],
                                work / "build.json")
    modes = {}
    for mode in ("per-read", "batch"):
        modes[mode], _ = dmh.computenodes(mn, "shm", 1, "query",
                                          ["--workload", wl, "--k", 10, "--ef-search", a.ef, "--threads", a.threads,
                                           "--coroutines", a.coroutines, "--read-mode", mode,
                                           "--repeat-seconds", a.seconds], work / f"query_{mode}.json")
hjson = work / "hnswlib.json"
dmh.run([dmh.BIN / "hnswlib-bench", "--base", base, "--workload", wl, "--metric", metric, "--m", a.m,
         "--ef-construction", a.ef_construction, "--ef-search", a.ef, "--k", 10, "--threads", a.threads, "--json", hjson])
hn = {r["ef_search"]: r for r in json.loads(hjson.read_text())["runs"]}

print(f"{a.set}: shine on 2 memnodes (shm), 1 computenode x {a.threads} threads x {a.coroutines} coroutines; "
      f"hnswlib with {a.threads} threads; M={a.m} efC={a.ef_construction}")
print(f"{'efSearch':>8} {'mode':>9} {'recall':>7} {'hnswlib':>7} {'QPS':>8} {'hnswQPS':>8} {'ratio':>7} "
      f"{'visited':>8} {'KiB/q':>7} {'vecKiB/q':>8} {'READs/q':>8} {'bells/q':>8}")
rows = []
for mode, rep in modes.items():
    for r in rep["runs"]:
        ef, pq, h = r["ef_search"], r["per_query"], hn[r["ef_search"]]
        ratio = r["qps"] / h["qps"]
        print(f"{ef:>8} {mode:>9} {r['recall']:>7.4f} {h['recall']:>7.4f} {r['qps']:>8.0f} {h['qps']:>8.0f} "
              f"{ratio:>7.4f} {pq['visited']:>8.1f} {pq['bytes'] / 1024:>7.1f} {pq['vector_bytes'] / 1024:>8.1f} "
              f"{pq['reads']:>8.1f} {pq['doorbells']:>8.1f}")
        rows.append({"ef_search": ef, "read_mode": mode, "recall": r["recall"], "hnswlib_recall": h["recall"],
                     "qps": r["qps"], "hnswlib_qps": h["qps"], "qps_ratio": ratio, "per_query": pq,
                     "latency_us": r["latency_us"], "network_bound_qps": r["network_bound_qps"]})
(work / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
print(f"wrote {work / 'results.json'}")
