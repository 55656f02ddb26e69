#!/usr/bin/python3
"""Plots experiments/soak/results.json: memory and fds of the long-lived processes by minute,
and the querier's batch latency by minute; prints the table of experiments/soak/README.md.

  experiments/soak/plot.py [results.json] [soak.png]
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
png = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "soak.png"
r = json.loads(src.read_text())
samples = r["samples"]
names = sorted({n for s in samples for n in s["procs"]})


def series(name, key):
    xs, ys = [], []
    for s in samples:
        v = s["procs"].get(name)
        if v:
            xs.append(s["t_s"] / 60)
            ys.append(v[key])
    return xs, ys


def querier_minutes():
    """p50 / p99 of the querier's search batches, by minute (minutes.py; results of older runs
    carry the whole timeline instead)."""
    q = r.get("querier")
    if not q:
        return [], [], []
    sys.path.insert(0, str(HERE))
    import minutes
    rows = q["timeline_by_minute"]["rows"] if "timeline_by_minute" in q else minutes.by_minute(q)
    return [x[0] for x in rows], [x[2] for x in rows], [x[3] for x in rows]


def table():
    lines = ["| process | own RSS at minute 5 | own RSS at the end | max | fds first / last / max | threads |",
             "|---|---|---|---|---|---|"]
    for n in names:
        _, own = series(n, "own_rss")
        _, fds = series(n, "fds")
        _, th = series(n, "threads")
        if not own:
            continue
        at5 = own[min(4, len(own) - 1)]
        lines.append(f"| {n} | {at5 / 2**20:.1f} MiB | {own[-1] / 2**20:.1f} MiB | {max(own) / 2**20:.1f} MiB | "
                     f"{fds[0]} / {fds[-1]} / {max(fds)} | {min(th)}–{max(th)} |")
    return "\n".join(lines)


def main():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    for n in names:
        x, y = series(n, "own_rss")
        ax[0].plot(x, [v / 2**20 for v in y], label=n)
        x, y = series(n, "fds")
        ax[1].plot(x, y, label=n)
    ax[0].set(xlabel="minute", ylabel="RSS outside the region (MiB)", title="memory")
    ax[1].set(xlabel="minute", ylabel="open fds", title="file descriptors")
    ax[0].legend(fontsize=7)
    mins, p50, p99 = querier_minutes()
    ax[2].plot(mins, p50, label="p50")
    ax[2].plot(mins, p99, label="p99")
    rounds = r.get("rounds", [])
    xs = [x["t_s"] / 60 for x in rounds if x.get("dhnsw")]
    ax[2].scatter(xs, [x["dhnsw"]["batch_p99_ms"] for x in rounds if x.get("dhnsw")], s=6, c="gray",
                  label="inserting computenode p99")
    ax[2].set(xlabel="minute", ylabel="ms per batch of 200 queries", title="d-HNSW querier latency", yscale="log")
    ax[2].legend(fontsize=7)
    fig.suptitle(f"soak: {r['minutes']:.0f} minutes, {len(rounds)} rounds, {len(r['failures'])} failures "
                 f"(provider {r['provider']})")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(table())
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
