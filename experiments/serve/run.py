#!/usr/bin/python3
"""`computenode serve` measured: its throughput against the in-process `query` path, and SHINE's
routing of live requests under a Zipf stream (see README.md here).

Part "throughput" (bigann10k, both modes, one computenode, --provider): the in-process query
run's QPS, then `serve` with the same engine settings driven by `serve-bench` (closed loop)
with several client counts and request sizes; the ratio serve / in-process.

Part "routing" (shine, syn100k, Zipf 1.0): serve-bench spreads the stream over K serving
computenodes with a node cache of C bytes each; routing none, then adaptive (and best-fit);
the node-cache hit rate (CHR) from the services' metrics, against CHR_max of one serving
computenode with a cache of K x C that sees the whole stream; CSP = 1 - CHR / CHR_max.

  experiments/serve/run.py [--parts throughput,routing] [--provider shm] [--seconds 15]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKEN = "serve-experiment-token"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--parts", default="throughput,routing")
ap.add_argument("--provider", default="shm")
ap.add_argument("--seconds", type=float, default=15, help="measured seconds per serve-bench run")
ap.add_argument("--warmup-seconds", type=float, default=5)
ap.add_argument("--configs", default="1:1,4:1,16:1,4:16,16:16,32:32,64:32",
                help="serve-bench CLIENTS:QUERIES_PER_REQUEST pairs (throughput)")
ap.add_argument("--cns", type=int, default=2, help="serving computenodes (routing)")
ap.add_argument("--cache-mib", type=float, default=4, help="node cache per serving computenode (routing)")
ap.add_argument("--policies", default="none,adaptive,adaptive-even,balanced,best-fit",
                help="routing policies; adaptive-even: adaptive with --adaptive-quota even")
ap.add_argument("--work", default=str(dmh.SHINE_WORK))
ap.add_argument("--out", default=str(HERE))
a = ap.parse_args()
CONFIGS = [tuple(int(x) for x in c.split(":")) for c in a.configs.split(",")]
work, out = Path(a.work), Path(a.out)
out.mkdir(parents=True, exist_ok=True)
logs = work / "serve_logs"
logs.mkdir(parents=True, exist_ok=True)
os.environ["DMHNSW_TOKEN"] = TOKEN  # memnodes, computenodes, serve-bench: one cluster with a token
ENV = dict(os.environ)


class Serve:
    """`computenode serve` on a free port with its metrics; stopped with SIGTERM on close."""

    def __init__(self, mn, mode, cn_id, num_cns, args, tag):
        self.log = logs / f"{tag}-cn{cn_id}.log"
        cmd = [dmh.BIN / "computenode", "--mode", mode, "--provider", a.provider, "--memnodes", mn.list, "--cn-id",
               cn_id, "--num-cns", num_cns, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        cmd = [str(x) for x in cmd + list(args)]
        with open(self.log, "w") as f:
            self.p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.time() + 300
        while True:
            text = self.log.read_text()
            m, mm = re.search(r"serving \w+ on (\S+)", text), re.search(r"metrics on \S+:(\d+)", text)
            if m and mm:
                self.address, self.metrics_port = m.group(1), int(mm.group(1))
                break
            if self.p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"serve did not start:\n{text[-3000:]}")
            time.sleep(0.1)

    def metrics(self):
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        text = urllib.request.urlopen(req, timeout=10).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def bench(targets, wl, clients, batch, seconds, tag, extra=()):
    j = logs / f"{tag}.bench.json"
    cmd = [dmh.BIN / "serve-bench", "--target", ",".join(targets), "--workload", wl, "--clients", clients,
           "--batch", batch, "--seconds", seconds, "--json", j] + list(extra)
    p = subprocess.run([str(x) for x in cmd], capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        raise RuntimeError(f"serve-bench failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(j.read_text())


def sweep(mn, mode, args, wl, inproc_qps):
    """serve-bench over CONFIGS against one serving computenode; the rows and its last metrics."""
    rows = []
    s = Serve(mn, mode, 0, 1, args, f"{mode}-tp")
    try:
        for c, b in CONFIGS:
            bench([s.address], wl, c, b, a.warmup_seconds, f"{mode}-warm-c{c}-b{b}")
            r = bench([s.address], wl, c, b, a.seconds, f"{mode}-c{c}-b{b}")
            rows.append({"clients": c, "batch": b, "qps": r["qps"], "recall": r["recall"],
                         "latency_us": r["latency_us"], "errors": r["errors"]})
            dmh.log(f"{mode} serve c={c} b={b}: {r['qps']:.0f} QPS (in-process {inproc_qps:.0f}), "
                    f"recall {r['recall']:.4f}")
        return rows, s.metrics()
    finally:
        s.close()


def throughput():
    res = {}
    name = "bigann10k"
    wl = dmh.shine_workload(name, work, "uniform", 2000, 200)
    # shine: 2 threads x 8 coroutines either way
    images = dmh.shine_index(name, work)
    rep = dmh.query_run(images, 1, wl, logs / "shine-inproc.json", threads=2, coroutines=8, ef_search=64,
                        provider=a.provider, repeat_seconds=a.seconds)
    inproc = dmh.summarize(rep)
    with dmh.Memnodes(None, a.provider, "1GiB", logs / "mn-shine", load=images) as mn:
        rows, _ = sweep(mn, "shine", ["--threads", 2, "--coroutines", 8, "--ef-search", 64], wl, inproc["qps"])
    res["shine"] = {"inproc": {"qps": inproc["qps"], "recall": inproc["recall"]}, "serve": rows}

    # dhnsw: batches of up to 500, probe 4, either way
    images = dmh.dhnsw_index(name, work, 10)
    with dmh.Memnodes(None, a.provider, "1GiB", logs / "mn-dhnsw-q", load=images) as mn:
        rep, _ = dmh.computenodes(mn, a.provider, 1, "query",
                                  ["--workload", wl, "--k", 10, "--batch", 500, "--probe", 4, "--ef-search", 64],
                                  logs / "dhnsw-inproc.json", logdir=logs / "dhnsw-inproc.logs", mode="dhnsw")
    dq = rep["runs"][0]
    with dmh.Memnodes(None, a.provider, "1GiB", logs / "mn-dhnsw", load=images) as mn:
        rows, m = sweep(mn, "dhnsw", ["--batch", 500, "--max-wait-us", 5000, "--probe", 4, "--ef-search", 64,
                                      "--max-k", 10], wl, dq["qps"])
    res["dhnsw"] = {"inproc": {"qps": dq["qps"], "recall": dq["recall"]}, "serve": rows,
                    "batches": m.get("dmhnsw_batch_queries_count"),
                    "mean_batch": m.get("dmhnsw_batch_queries_sum", 0) / max(1, m.get("dmhnsw_batch_queries_count", 1))}
    return res


def cache_counts(servers):
    hits = lookups = reads = queries = 0.0
    for s in servers:
        m = s.metrics()
        hits += m.get('dmhnsw_cache_hits_total{cache="node"}', 0)
        lookups += m.get('dmhnsw_cache_lookups_total{cache="node"}', 0)
        reads += m.get('dmhnsw_remote_reads_total{mode="shine"}', 0)
        queries += m.get('dmhnsw_queries_total{mode="shine"}', 0)
    return hits, lookups, reads, queries


def routing_run(images, wl, k, cache_bytes, policy, tag):
    with dmh.Memnodes(None, a.provider, "1GiB", logs / f"mn-{tag}", load=images) as mn:
        servers = []
        try:
            for i in range(k):
                servers.append(Serve(mn, "shine", i, k, ["--threads", 1, "--coroutines", 8, "--ef-search", 64,
                                                         "--cache-bytes", int(cache_bytes),
                                                         "--routing", policy.replace("-even", ""),
                                                         "--adaptive-quota", "even" if policy.endswith("-even") else "demand",
                                                         "--route-batch", 200, "--route-threshold", 50], tag))
            targets = [s.address for s in servers]
            bench(targets, wl, 4 * k, 8, a.warmup_seconds * 2, f"{tag}-warm")  # fills the caches
            h0, l0, r0, q0 = cache_counts(servers)
            r = bench(targets, wl, 4 * k, 8, a.seconds, tag)
            h1, l1, r1, q1 = cache_counts(servers)
            routed = sum(s.metrics().get('dmhnsw_routed_total{to="peer"}', 0) for s in servers)
        finally:
            for s in servers:
                s.close()
    chr_ = (h1 - h0) / max(1.0, l1 - l0)
    row = {"policy": policy, "cns": k, "cache_bytes": cache_bytes, "qps": r["qps"], "recall": r["recall"],
           "chr": chr_, "reads_per_query": (r1 - r0) / max(1.0, q1 - q0), "routed_to_peer": routed,
           "latency_us": r["latency_us"], "errors": r["errors"]}
    dmh.log(f"{tag}: QPS {r['qps']:.0f}, recall {r['recall']:.4f}, CHR {chr_:.4f}, "
            f"READs/query {row['reads_per_query']:.1f}")
    return row


def routing():
    name = "syn100k"
    images = dmh.shine_index(name, work)
    wl = dmh.shine_workload(name, work, "zipf:1.0", 10000, 5000)
    c = a.cache_mib * 2**20
    ref = routing_run(images, wl, 1, c * a.cns, "none", "ref")  # one cache of the summed size
    rows = [routing_run(images, wl, a.cns, c, p, f"route-{p}") for p in a.policies.split(",")]
    for r in rows:
        r["chr_max"] = ref["chr"]
        r["csp"] = 1 - r["chr"] / ref["chr"] if ref["chr"] > 0 else None
    return {"set": name, "dist": "zipf:1.0", "reference": ref, "runs": rows}


results = {"command": " ".join(sys.argv), "provider": a.provider, "seconds": a.seconds}
t0 = time.time()
if "throughput" in a.parts:
    results["throughput"] = throughput()
if "routing" in a.parts:
    results["routing"] = routing()
results["wall_seconds"] = time.time() - t0
tmp = out / "results.json.tmp"
tmp.write_text(json.dumps(results, indent=1))
tmp.replace(out / "results.json")

md = []
if "throughput" in results:
    md += ["| mode | in-process QPS | clients | queries/request | serve QPS | serve / in-process | recall@10 | p50 µs | p99 µs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for mode in ("shine", "dhnsw"):
        t = results["throughput"][mode]
        for r in t["serve"]:
            md.append(f"| {mode} | {t['inproc']['qps']:.0f} | {r['clients']} | {r['batch']} | {r['qps']:.0f} | "
                      f"{r['qps'] / t['inproc']['qps']:.2f} | {r['recall']:.4f} | {r['latency_us']['p50']:.0f} | "
                      f"{r['latency_us']['p99']:.0f} |")
    md.append("")
if "routing" in results:
    rr = results["routing"]
    md += ["| serving computenodes | routing | node cache each | QPS | recall@10 | CHR | CHR_max | CSP | READs/query | queries sent to a peer |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    ref = rr["reference"]
    md.append(f"| 1 (reference) | none | {ref['cache_bytes'] / 2**20:.0f} MiB | {ref['qps']:.0f} | {ref['recall']:.4f} | "
              f"{ref['chr']:.4f} | | | {ref['reads_per_query']:.1f} | |")
    for r in rr["runs"]:
        md.append(f"| {r['cns']} | {r['policy']} | {r['cache_bytes'] / 2**20:.0f} MiB | {r['qps']:.0f} | {r['recall']:.4f} | "
                  f"{r['chr']:.4f} | {r['chr_max']:.4f} | {r['csp']:.4f} | {r['reads_per_query']:.1f} | "
                  f"{r['routed_to_peer']:.0f} |")
(out / "results.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
