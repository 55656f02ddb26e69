"""The d-HNSW querier's per-batch timeline reduced to one row per minute (run.py stores these
rows in results.json instead of every batch; plot.py draws them)."""
import math

FIELDS = ["minute", "batches", "search_ms_p50", "search_ms_p99", "epoch_max"]


def percentile(values, p):
    """numpy.percentile's default (linear between the closest ranks), without numpy."""
    v = sorted(values)
    x = p / 100 * (len(v) - 1)
    lo, hi = math.floor(x), math.ceil(x)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)


def by_minute(querier):
    """Rows of FIELDS from a `query --mix` report's timeline (timeline_fields name its columns)."""
    f = querier["timeline_fields"]
    t, ms, ep = f.index("t_s"), f.index("search_ms"), f.index("epoch")
    by = {}
    for row in querier["timeline"]:
        by.setdefault(int(row[t] // 60), []).append(row)
    return [[m, len(rows), percentile([r[ms] for r in rows], 50), percentile([r[ms] for r in rows], 99),
             max(r[ep] for r in rows)] for m, rows in sorted(by.items())]
