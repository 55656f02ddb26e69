#!/usr/bin/python3
"""The cost curve: both modes, hnswlib and Faiss HNSW on clustered data of 10K to 10M vectors.

For each size N (--sizes), ../vs_hnswlib/run.py runs on `datagen --n N --d D --clusters C` (the
same mixture at every size: the seed draws the centres first), with exact ground truth computed
by `groundtruth` a block of base rows at a time: hnswlib, Faiss IndexHNSWFlat, shine (one
computenode builds and queries, no cache, reading in place on cxl) and d-HNSW (P = N / 10,000
partitions, at least 16, at most 1,000; b = 2, 4, 8) over 2 memnodes, 2 threads each. Its
results go to experiments/scale_10m/n<N>/. Then per size and system: build seconds, QPS at
recall@10 0.90 / 0.95 / 0.99 (interpolated along the efSearch curve; d-HNSW over every b), bytes
per query there, and memory (hnswlib and Faiss: the process's peak RSS; shine and d-HNSW: the
memnodes' peak RSS plus the querying computenode's own memory). One log-log plot per measure,
with each curve's slope (least squares over the sizes measured).

  experiments/scale_10m/run.py [--sizes 10000,100000,1000000,10000000] [--d 96]
  experiments/scale_10m/run.py --sizes 10000000 --skip faiss   # one size, without Faiss's build
  experiments/scale_10m/run.py --render-only        # tables and plots from the n<N>/ results
"""
import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--sizes", default="10000,100000,1000000,10000000", help="N values (default %(default)s)")
ap.add_argument("--d", type=int, default=96, help="dimension (default %(default)s)")
ap.add_argument("--clusters", type=int, default=1000, help="mixture components (default %(default)s)")
ap.add_argument("--ef-search", default="16,32,64,128,256,512", help="efSearch values (default %(default)s)")
ap.add_argument("--queries", type=int, default=10000, help="measured queries per run (default %(default)s)")
ap.add_argument("--threads", type=int, default=2, help="threads everywhere (default %(default)s)")
ap.add_argument("--probes", default="2,4,8", help="d-HNSW b values (default %(default)s)")
ap.add_argument("--wire", default="none", help="a wire model whose query runs follow those without one, e.g. "
                "rdma-100g; the plots and slopes take only the runs without (default %(default)s)")
ap.add_argument("--skip", default="", help="parts of ../vs_hnswlib/run.py to skip besides import (e.g. faiss)")
ap.add_argument("--keep-references", action="store_true", help="../vs_hnswlib/run.py --keep-references: hnswlib's "
                "results (or its saved index, searched again) from an earlier run in runs/scale_10m/n<N>/")
ap.add_argument("--render-only", action="store_true", help="only the tables and plots, from existing results")
a = ap.parse_args()
sizes = [int(x) for x in a.sizes.split(",")]
t_start = time.time()


def partitions(n):
    return max(16, min(1000, n // 10000))


def region(n):
    """A shine memnode's region for n vectors over 2 memnodes: ~700 B per record at d = 96-128, x 1.5."""
    gib = math.ceil(n * 700 * 1.5 / 2 / 2**30)
    return f"{max(gib, 1)}GiB"


if not a.render_only:
    for n in sizes:
        out = HERE / f"n{n}"
        if (out / "results.json").exists() and not a.skip:  # with --skip, ../vs_hnswlib/run.py merges into it
            dmh.log(f"n = {n:,}: {out / 'results.json'} exists; kept")
            continue
        dmh.log(f"n = {n:,}: ../vs_hnswlib/run.py")
        subprocess.run([sys.executable, str(HERE.parent / "vs_hnswlib" / "run.py"), "--set", "syn", "--n", str(n),
                        "--d", str(a.d), "--clusters", str(a.clusters), "--queries", str(a.queries),
                        "--ef-search", a.ef_search, "--threads", str(a.threads), "--partitions", str(partitions(n)),
                        "--probes", a.probes, "--wire", a.wire, "--skip", ",".join(["import"] + list(filter(None, a.skip.split(",")))), "--region", region(n),
                        "--work", str(dmh.ROOT / "runs" / "scale_10m" / f"n{n}"), "--out", str(out)]
                       + (["--keep-references"] if a.keep_references else []), check=True)


def frontier(runs):
    """(recall, qps, bytes) points, best QPS at each recall, recall rising."""
    pts = sorted(((r["recall"], r["qps"], r.get("bytes_per_query")) for r in runs), key=lambda p: (p[0], -p[1]))
    out = []
    for p in sorted(pts, key=lambda p: -p[0]):  # from the highest recall down: keep those faster than all above
        if not out or p[1] > out[-1][1]:
            out.append(p)
    return sorted(out)


def at_recall(runs, target):
    """QPS and bytes per query at `target` recall, interpolated (QPS on a log scale) between the
    two frontier points around it; None when no run reaches it."""
    f = frontier(runs)
    for lo, hi in zip(f, f[1:]):
        if lo[0] <= target <= hi[0]:
            t = (target - lo[0]) / max(hi[0] - lo[0], 1e-12)
            qps = math.exp(math.log(lo[1]) + t * (math.log(hi[1]) - math.log(lo[1])))
            b = None if lo[2] is None or hi[2] is None else lo[2] + t * (hi[2] - lo[2])
            return qps, b
    if f and f[0][0] >= target:
        return f[0][1], f[0][2]
    return None, None


def mib(x):
    return x if x is not None else 0


def system_rows(res, work):
    """Per system: build seconds, runs, memory (MiB): hnswlib and Faiss their process's own (anonymous)
    memory, the index; shine the bytes its build used in the memnodes' regions plus the querying
    computenode's own memory; d-HNSW the regions' data (sub-HNSWs, metadata, id index, insert buffer)
    plus the querying computenode's own memory."""
    rows = {}
    for ref in ("hnswlib", "faiss"):
        if ref in res:
            m = res[ref]["memory"]
            rows[ref] = {"build_s": res[ref]["build_s"], "runs": res[ref]["runs"],
                         "memory_mib": m.get("peak_anon_mib") or m.get("peak_rss_mib")}
    if "shine" in res:
        s = res["shine"]
        q = [v for k, v in s.items() if k == "query_batch_none"]
        runs = q[0]["runs"] if q else []
        own = (q[0].get("computenode_memory") or {}).get("anon_mib") if q else None
        used = s["build"].get("memnode_bytes_used")
        if used is None and (work / "shine_build.json").exists():  # a run before run.py kept it
            used = sum(u["bytes_used"] for u in json.loads((work / "shine_build.json").read_text())["memnode_usage"])
        rows["shine"] = {"build_s": s["build"]["seconds"], "runs": runs, "memory_mib": mib(used) / 2**20 + mib(own)}
    if "dhnsw" in res:
        d = res["dhnsw"]
        runs, own = [], 0
        for k, v in d.items():
            if k.startswith("query_") and k.endswith("_none"):  # on cxl itself, no wire model
                runs += v["runs"]
                own = max(own, mib((v.get("computenode_memory") or {}).get("anon_mib")))
        data = sum(d["build"]["report"].get("layout", {}).get("data_end", []))
        rows["dhnsw"] = {"build_s": d["build"]["seconds"], "runs": runs, "memory_mib": data / 2**20 + own}
    return rows


colors = {"hnswlib": "C0", "faiss": "C1", "shine": "C2", "dhnsw": "C3"}  # one per system in every panel
names = {"hnswlib": "hnswlib", "faiss": "Faiss IndexHNSWFlat", "shine": "shine (cxl, in place)", "dhnsw": "d-HNSW (cxl)"}
table = {}  # system -> n -> measures
for n in sizes:
    f = HERE / f"n{n}" / "results.json"
    if not f.exists():
        continue
    res = json.loads(f.read_text())
    for sys_, r in system_rows(res, dmh.ROOT / "runs" / "scale_10m" / f"n{n}").items():
        m = {"build_s": r["build_s"], "memory_mib": r["memory_mib"], "max_recall": max((x["recall"] for x in r["runs"]), default=None)}
        for t in (0.90, 0.95, 0.99):
            m[f"qps@{t}"], m[f"bytes@{t}"] = at_recall(r["runs"], t)
        table.setdefault(sys_, {})[n] = m


def slope(points):
    """Least-squares slope of log y over log x."""
    pts = [(math.log(x), math.log(y)) for x, y in points if y]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


# Recall 0.90 beside 0.95: at 10M this data's graphs (M 16, efConstruction 100) stop short of 0.95.
measures = [("build_s", "build time (s)"), ("qps@0.9", "QPS at recall@10 0.90"), ("qps@0.95", "QPS at recall@10 0.95"),
            ("memory_mib", "memory (MiB): index + querying computenode's own"),
            ("bytes@0.9", "remote bytes per query at recall@10 0.90"),
            ("bytes@0.95", "remote bytes per query at recall@10 0.95")]
md = [f"Run {time.strftime('%Y-%m-%d %H:%M')}: `{dmh.command_line()}`\n\n",
      f"Clustered vectors (d = {a.d}, {a.clusters} clusters), {a.queries:,} queries, k = 10, M = 16, "
      f"efConstruction = 100, {a.threads} threads everywhere; shine and d-HNSW over 2 memnodes on cxl. "
      "QPS and bytes at a recall are interpolated along each system's efSearch curve (d-HNSW: the best "
      "of b = 2, 4, 8); – where no run reached it.\n"]
for key, label in measures:
    rows = []
    for sys_, per in table.items():
        pts = [(n, per[n][key]) for n in sizes if n in per and per[n][key]]
        s = slope(pts)
        rows.append([names[sys_]] + [("–" if n not in per or per[n][key] is None else f"{per[n][key]:,.4g}")
                                     for n in sizes] + ["–" if s is None else f"{s:.2f}"])
    md += [f"\n{label}:\n\n", dmh.md_table(["system"] + [f"{n:,}" for n in sizes] + ["slope (log-log)"], rows)]
rows = []
for sys_, per in table.items():
    rows.append([names[sys_]] + ["–" if n not in per else f"{per[n]['max_recall']:.4f}" for n in sizes])
md += ["\nHighest recall@10 reached:\n\n", dmh.md_table(["system"] + [f"{n:,}" for n in sizes], rows)]
(HERE / "results.json").write_text(json.dumps({"sizes": sizes, "table": table}, indent=2) + "\n")
(HERE / "results.md").write_text("".join(md))
print("".join(md))

plt = dmh.pyplot()
if plt:
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, label) in zip(axes.flat, measures):
        for sys_, per in table.items():
            pts = [(n, per[n][key]) for n in sizes if n in per and per[n][key]]
            if not pts:
                continue
            s = slope(pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[sys_],
                    label=f"{names[sys_]}" + ("" if s is None else f" (slope {s:.2f})"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("vectors")
        ax.set_title(label)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "cost_curve.png", dpi=110)
    dmh.log(f"wrote {HERE / 'cost_curve.png'}")
dmh.log(f"scale_10m: {(time.time() - t_start) / 60:.0f} min")
