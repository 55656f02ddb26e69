#!/usr/bin/python3
"""Compressed vectors against the float index, in the same run, either mode.

One index per --codes kind is built into 2 memnodes (one computenode, T threads); every query
run uses the same index: --rerank 0 reads full vectors throughout (the float index's search),
--rerank R searches over codes (shine: the computenode's copy of every node's code; dhnsw:
sub-HNSWs fetched with codes instead of vectors) and re-ranks the best R with their vectors.
Each at the --ef-search values, without and with the wire model. Per run: recall@10, QPS,
bytes / READs per query. Results: OUT/results.json and OUT/results.md (OUT: SET/, or SET-dhnsw/).

  experiments/codes/run.py --set wordnet --codes sq8,pq:48 --rerank 0,20,50
  experiments/codes/run.py --mode dhnsw --set wordnet --codes sq8 --rerank 0,20 --wire none,rdma-56g
  experiments/codes/run.py --set wordnet --codes sq8 --rerank 0,20 --cache none,vectors:0.1,lists:0.1

shine's --cache: node caches to compare, each HOLDS:RATIO[:P] (--cache-holds, --cache-ratio,
--admit-probability) or none;
every rerank runs with each. The "vs float" columns compare with the float search without a cache.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--mode", default="shine", choices=["shine", "dhnsw"])
ap.add_argument("--partitions", type=int, default=16, help="dhnsw: P (default %(default)s)")
ap.add_argument("--probe", type=int, default=4, help="dhnsw: partitions per query (default %(default)s)")
ap.add_argument("--batch", type=int, default=1000, help="dhnsw: queries per batch (default %(default)s)")
ap.add_argument("--set", default="wordnet", help="wordnet, bigann10k, syn100k, syn1m or syn768 (default %(default)s)")
ap.add_argument("--codes", default="sq8,pq:48", help="--codes kinds, one index each (default %(default)s)")
ap.add_argument("--rerank", default="0,20,50", help="--rerank values; 0: full vectors (default %(default)s)")
ap.add_argument("--ef-search", default="32,64,128", help="efSearch values (default %(default)s)")
ap.add_argument("--m", type=int, default=16)
ap.add_argument("--ef-construction", type=int, default=100)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--coroutines", type=int, default=4)
ap.add_argument("--provider", default="cxl")
ap.add_argument("--wire", default="none,rdma-100g", help="wire models of the query runs (default %(default)s)")
ap.add_argument("--cache", default="none", help="shine: node caches, none or HOLDS:RATIO[:P] each (default %(default)s)")
ap.add_argument("--region", default="1GiB")
ap.add_argument("--work", default=None, help="data and logs (default runs/codes/SET)")
ap.add_argument("--out", default=None, help="results folder (default this folder's SET/)")
a = ap.parse_args()

work = Path(a.work or dmh.ROOT / "runs" / "codes" / a.set)
work.mkdir(parents=True, exist_ok=True)
out = Path(a.out or HERE / (a.set if a.mode == "shine" else f"{a.set}-dhnsw"))
out.mkdir(parents=True, exist_ok=True)
base, wl, metric = dmh.dataset(a.set, work)
results = {"mode": a.mode, "set": a.set, "provider": a.provider, "m": a.m, "ef_construction": a.ef_construction,
           "threads": a.threads, "coroutines": a.coroutines, "command": " ".join(sys.argv), "indexes": []}
for codes in a.codes.split(","):
    dmh.log(f"{a.set}: build with --codes {codes}")
    with dmh.Memnodes(2, a.provider, a.region, work / "mn") as mn:
        cn = [str(dmh.BIN / "computenode"), "--mode", a.mode, "--provider", a.provider, "--memnodes", mn.list]
        rep = work / "build.json"
        extra = ["--partitions", a.partitions] if a.mode == "dhnsw" else []
        dmh.run(cn + ["build", "--data", base, "--m", a.m, "--ef-construction", a.ef_construction, "--metric", metric,
                      "--threads", a.threads, "--codes", codes, "--report", rep] + extra)
        b = json.loads(rep.read_text())
        idx = {"codes": codes, "build_seconds": b["seconds"], "code_size": b["codes"]["code_size"], "runs": []}
        qextra = (["--probe", a.probe, "--batch", a.batch, "--search-threads", a.threads] if a.mode == "dhnsw"
                  else ["--threads", a.threads, "--coroutines", a.coroutines])
        for wire, rerank, cache in [(w, r, c) for w in a.wire.split(",") for r in a.rerank.split(",")
                                    for c in a.cache.split(",")]:
                q = work / "q.json"
                cx = cache.split(":")
                cextra = [] if cache == "none" else (["--cache-holds", cx[0], "--cache-ratio", cx[1]]
                                                     + (["--admit-probability", cx[2]] if len(cx) > 2 else []))
                dmh.run(cn + ["--wire", wire, "query", "--workload", wl, "--k", 10, "--ef-search", a.ef_search,
                              "--rerank", rerank, "--report", q] + qextra + cextra)
                r = json.loads(q.read_text())
                for run in r["runs"]:
                    pq = dict(run["per_query"])
                    if a.mode == "dhnsw":  # sub-HNSW fetches and re-rank READs together
                        pq["bytes"] = pq["total_bytes"]
                        pq["reads"] = pq["reads"] + pq["rerank_reads"]
                    idx["runs"].append({"wire": wire, "rerank": int(rerank), "cache": cache,
                                        "cache_hit_rate": run.get("cache_hit_rate", 0), "ef_search": run["ef_search"],
                                        "recall": run["recall"], "qps": run["qps"], "per_query": pq,
                                        "codes_bytes": (r["codes"] or {}).get("bytes", 0),
                                        # the querying computenode's own memory (over cxl the mapped
                                        # regions are shared memory, not counted here)
                                        "cn_anon_mib": (r.get("process_memory") or {}).get("anon_mib")})
                dmh.log(f"  {codes} wire {wire} rerank {rerank} cache {cache}: " + ", ".join(
                    f"ef {x['ef_search']} R {x['recall']:.4f} {x['qps']:.0f} qps {x['per_query']['bytes']:.0f} B"
                    for x in idx["runs"][-len(r["runs"]):]))
        results["indexes"].append(idx)

rows = []
for idx in results["indexes"]:
    full = {(x["wire"], x["ef_search"]): x for x in idx["runs"] if x["rerank"] == 0 and x.get("cache", "none") == "none"}
    caches = len({x.get("cache", "none") for x in idx["runs"]}) > 1
    for x in idx["runs"]:
        f = full.get((x["wire"], x["ef_search"]))
        rows.append([idx["codes"], x["wire"], x["ef_search"], x["rerank"] or "float"]
                    + ([x.get("cache", "none"), f"{x.get('cache_hit_rate', 0):.2f}"] if caches else [])
                    + [f"{x['recall']:.4f}",
                     f"{x['qps']:.0f}", f"{x['per_query']['bytes']:.0f}",
                     f"{f['per_query']['bytes'] / x['per_query']['bytes']:.1f}x" if f else "",
                     f"{x['qps'] / f['qps']:.2f}x" if f else "", f"{x['per_query']['reads']:.0f}",
                     f"{x['codes_bytes'] / 2**20:.1f}",
                     f"{x['cn_anon_mib']:.0f}" if x.get("cn_anon_mib") is not None else ""])
caches = any(len({x.get("cache", "none") for x in i["runs"]}) > 1 for i in results["indexes"])
md = dmh.md_table(["codes", "wire", "efSearch", "rerank"] + (["cache", "hit rate"] if caches else [])
                  + ["recall@10", "QPS", "bytes/query", "fewer bytes", "QPS vs float", "READs/query", "codes MiB",
                     "computenode MiB"], rows)
(out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
(out / "results.md").write_text(f"`{results['command']}`\n\n{md}\n")
print(md)
