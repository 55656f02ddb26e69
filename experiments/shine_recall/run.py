#!/usr/bin/env python3
"""Recall parity of shine mode with hnswlib (see README.md here).

For each data set: 2 memnodes, a shine index built by 2 computenodes x 2 threads, the same
uniform workload queried over several efSearch values; hnswlib (Debian libhnswlib-dev, via
tools/hnswlib-bench) built with the same M, efConstruction and queried with the same
efSearch. Prints recall@10 side by side and writes results.json.

  experiments/shine_recall/run.py [--sets bigann10k,wordnet,syn100k] [--ef 10,20,40,80,160]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sets", default="bigann10k,wordnet,syn100k")
ap.add_argument("--ef", default="10,20,40,80,160")
ap.add_argument("--m", type=int, default=16)
ap.add_argument("--ef-construction", type=int, default=200)
ap.add_argument("--provider", default="shm")
ap.add_argument("--build-coroutines", type=int, default=1, help="inserts in flight per build thread")
ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "shine_recall"))
ap.add_argument("--out", default=None, help="results JSON (default: WORK/results.json)")
ap.add_argument("--repeats", type=int, default=1,
                help="independent builds per system; recall is averaged over them (multi-threaded builds vary)")
a = ap.parse_args()

work = Path(a.work)
work.mkdir(parents=True, exist_ok=True)
results = []
ok = True
for name in a.sets.split(","):
    base, wl, metric = dmh.dataset(name, work)
    print(f"== {name}: shine (2 memnodes, 2 computenodes x 2 threads x {a.build_coroutines} coroutines) "
          f"and hnswlib (2 threads), M={a.m} efC={a.ef_construction}, {a.repeats} build(s) each", flush=True)
    shine_runs, hn_runs = [], []
    for rep in range(a.repeats):
        tag = f"{name}_{rep}"
        with dmh.Memnodes(2, a.provider, "1GiB", work / f"{tag}_mn") as mn:
            build, _ = dmh.computenodes(mn, a.provider, 2, "build",
                                        ["--data", base, "--m", a.m, "--ef-construction", a.ef_construction,
                                         "--metric", metric, "--threads", 2, "--coroutines", a.build_coroutines],
                                        work / f"{tag}_build.json")
            query, _ = dmh.computenodes(mn, a.provider, 2, "query",
                                        ["--workload", wl, "--k", 10, "--ef-search", a.ef, "--threads", 2,
                                         "--coroutines", 4], work / f"{tag}_query.json")
        hjson = work / f"{tag}_hnswlib.json"
        dmh.run([dmh.BIN / "hnswlib-bench", "--base", base, "--workload", wl, "--metric", metric, "--m", a.m,
                 "--ef-construction", a.ef_construction, "--ef-search", a.ef, "--k", 10, "--threads", 2,
                 "--seed", 100 + rep, "--json", hjson])
        hn = json.loads(hjson.read_text())
        print(f"   build {rep}: shine {build['seconds']:.1f} s ({build['inserts_per_s']:.0f}/s), "
              f"hnswlib {hn['build_seconds']:.1f} s", flush=True)
        shine_runs.append({r["ef_search"]: r["recall"] for r in query["runs"]})
        hn_runs.append({r["ef_search"]: r["recall"] for r in hn["runs"]})
    print(f"   {'efSearch':>8} {'shine':>8} {'hnswlib':>8} {'diff':>8}   (mean over builds; min..max)")
    for ef in shine_runs[0]:
        s_all = [r[ef] for r in shine_runs]
        h_all = [r[ef] for r in hn_runs]
        s, h = sum(s_all) / len(s_all), sum(h_all) / len(h_all)
        ok &= abs(s - h) <= 0.01
        spread = f"   shine {min(s_all):.4f}..{max(s_all):.4f}, hnswlib {min(h_all):.4f}..{max(h_all):.4f}" \
            if a.repeats > 1 else ""
        print(f"   {ef:>8} {s:>8.4f} {h:>8.4f} {s - h:>+8.4f}{'' if abs(s - h) <= 0.01 else '  > 0.01'}{spread}")
        results.append({"set": name, "ef_search": ef, "shine_recall": s, "hnswlib_recall": h,
                        "shine_recalls": s_all, "hnswlib_recalls": h_all})
    print(flush=True)
out = Path(a.out) if a.out else work / "results.json"
out.write_text(json.dumps(results, indent=2) + "\n")
print(f"recall parity (|shine - hnswlib| <= 0.01 at every efSearch): {'yes' if ok else 'NO'}; wrote {out}")
