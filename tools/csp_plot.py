#!/usr/bin/env python3
"""Plot of csp-report's JSON: CSP and hit rates (CHR, CHR_max) against the number of
computenodes (one line per run label) or against the run label (bars).

Run by `csp-report --png` (installed next to it); also usable by hand:
    csp_plot.py --json report.json --png out.png [--x num_cns|label]
"""
import argparse
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # csp-report checks first; this is for direct use
    sys.stderr.write(f"csp_plot.py: needs matplotlib (Debian package python3-matplotlib): {e}\n")
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="csp-report --json output")
    ap.add_argument("--png", required=True, help="output image")
    ap.add_argument("--x", choices=["num_cns", "label"], default=None, help="x axis (default: the JSON's)")
    a = ap.parse_args()
    with open(a.json) as f:
        doc = json.load(f)
    runs = doc["runs"]
    x = a.x or doc.get("x", "num_cns")
    if not runs:
        sys.stderr.write("csp_plot.py: no runs\n")
        return 1

    fig, (ax_csp, ax_chr) = plt.subplots(1, 2, figsize=(11, 4.2))
    if x == "num_cns":
        labels = []
        for r in runs:
            if r["label"] not in labels:
                labels.append(r["label"])
        for i, lab in enumerate(labels):
            rs = sorted((r for r in runs if r["label"] == lab), key=lambda r: r["num_cns"])
            xs = [r["num_cns"] for r in rs]
            color = f"C{i % 10}"
            ax_csp.plot(xs, [r["csp"] for r in rs], "o-", color=color, label=lab)
            ax_chr.plot(xs, [r["chr"] for r in rs], "o-", color=color, label=f"{lab} CHR")
            ax_chr.plot(xs, [r["chr_max"] for r in rs], "s--", color=color, alpha=0.7, label=f"{lab} CHR_max")
        for ax in (ax_csp, ax_chr):
            ax.set_xlabel("computenodes")
            ax.set_xticks(sorted({r["num_cns"] for r in runs}))
    else:
        names = [r["label"] for r in runs]
        if len(set(names)) != len(names):  # same label, several runs: tell them apart
            names = [f'{r["label"]} ({r["num_cns"]} cn, #{i + 1})' for i, r in enumerate(runs)]
        pos = list(range(len(runs)))
        bars = ax_csp.bar(pos, [r["csp"] for r in runs], color="C3")
        ax_csp.bar_label(bars, fmt="%.3f", fontsize=8)
        w = 0.4
        ax_chr.bar([p - w / 2 for p in pos], [r["chr"] for r in runs], w, label="CHR")
        ax_chr.bar([p + w / 2 for p in pos], [r["chr_max"] for r in runs], w, label="CHR_max")
        for ax in (ax_csp, ax_chr):
            ax.set_xticks(pos)
            ax.set_xticklabels(names, rotation=20, ha="right")
    ax_csp.set_ylabel("cache segmentation penalty (CSP)")
    top = max(r["csp"] for r in runs)
    ax_csp.set_ylim(min(0.0, min(r["csp"] for r in runs) * 1.15), min(1.0, max(0.05, top * 1.15)) if top < 0.87 else 1.0)
    ax_chr.set_ylabel("cache hit rate")
    ax_chr.set_ylim(0, 1)
    for ax in (ax_csp, ax_chr):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_csp.set_title("CSP = 1 - CHR / CHR_max")
    ax_chr.set_title("CHR (own caches) and CHR_max (one shared cache)")
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
