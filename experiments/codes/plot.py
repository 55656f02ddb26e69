#!/usr/bin/python3
"""Recall@10 against QPS on one data set: dmhnsw's float and coded searches (run.py's
results.json, both modes) beside hnswlib and Faiss (hnswlib-bench and faiss-bench JSON reports
of the same data, M, efConstruction, efSearch values and threads). One curve per system and
--rerank, over efSearch, without a wire model.

  experiments/codes/plot.py --shine wordnet/results.json wordnet-pq/results.json --dhnsw wordnet-dhnsw/results.json \\
      --ref wordnet-ref/hnswlib.json wordnet-ref/faiss-flat.json wordnet-ref/faiss-sq8.json \\
      wordnet-ref/faiss-pq48.json --out wordnet/recall_qps.png
"""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--shine", nargs="*", default=[], help="run.py results.json of --mode shine")
ap.add_argument("--dhnsw", nargs="*", default=[], help="run.py results.json of --mode dhnsw")
ap.add_argument("--ref", nargs="*", default=[], help="hnswlib-bench / faiss-bench --json reports")
ap.add_argument("--wire", default="none", help="the wire model whose runs are drawn (default %(default)s)")
ap.add_argument("--title", default="")
ap.add_argument("--out", required=True)
a = ap.parse_args()

curves = {}  # label -> [(recall, qps)]
owner = {}  # label -> the file it is drawn from (a float curve in several files: the first one's)
for mode, files in (("shine", a.shine), ("d-HNSW", a.dhnsw)):
    for f in files:
        r = json.loads(Path(f).read_text())
        for idx in r["indexes"]:
            for x in idx["runs"]:
                if x["wire"] != a.wire or x.get("cache", "none") != "none":
                    continue
                label = f"dmhnsw {mode}, " + ("float" if x["rerank"] == 0 else f"{idx['codes']} R {x['rerank']}")
                if owner.setdefault(label, f) != f:
                    continue
                curves.setdefault(label, []).append((x["ef_search"], x["recall"], x["qps"]))
for f in a.ref:
    r = json.loads(Path(f).read_text())
    tool = r.get("tool", "hnswlib-bench")
    for x in r["runs"]:
        if tool == "faiss-bench":
            kind = r["index"] + (f" R {x['rerank']}" if x.get("rerank") else "")
            label = f"Faiss {kind}"
        else:
            label = "hnswlib"
        curves.setdefault(label, []).append((x["ef_search"], x["recall"], x["qps"]))

fig, ax = plt.subplots(figsize=(7.5, 5))
colors = plt.cm.tab20.colors  # one colour per curve (the default cycle repeats after 10)
for i, (label, pts) in enumerate(sorted(curves.items())):
    pts = sorted(set(pts))
    style = "-" if label.startswith("dmhnsw") else "--"
    ax.plot([p[1] for p in pts], [p[2] for p in pts], style, marker="o" if style == "-" else "s", markersize=3,
            color=colors[i % len(colors)], label=label)
ax.set_xlabel("recall@10")
ax.set_ylabel("queries / s (2 threads)")
ax.set_yscale("log")
ax.grid(True, which="both", alpha=0.3)
ax.set_title(a.title or f"recall against QPS (wire: {a.wire}; points: efSearch)")
ax.legend(fontsize=7)
fig.tight_layout()
Path(a.out).parent.mkdir(parents=True, exist_ok=True)
tmp = Path(a.out).with_suffix(".tmp.png")
fig.savefig(tmp, dpi=110)
tmp.replace(a.out)
print(a.out)
