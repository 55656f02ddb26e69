"""Statistics of a shine graph read straight from the memnodes' regions (over `cxl` each region is a
memfd of its memnode process: /proc/<pid>/fd). Walks the node records of every memnode from the
end of the reuse log to the bump word (compute/shine/layout.hpp, common/region.hpp) and reports
per-level degrees, nodes no list names, live nodes the entry point cannot reach, and the records
by generation. Used by rounds.py; needs M of the index (16 in experiments/churn)."""
import os
from collections import Counter
from pathlib import Path

import numpy as np

MAGIC = 0x5E1E


def regions(mn):
    """Each memnode's region as bytes (a copy), or None when a region is not a readable memfd."""
    out = []
    for p in mn.procs:
        for f in Path(f"/proc/{p.pid}/fd").iterdir():
            try:
                if os.readlink(f).startswith("/memfd:dmhnsw-region"):
                    with open(f, "rb") as fh:
                        out.append(np.frombuffer(fh.read(), dtype=np.uint8))
                    break
            except OSError:
                continue
        else:
            return None
    return out


def stats(mn, dim, m=16):
    regs = regions(mn)
    if regs is None:
        return None
    vector_part = (16 + 4 * dim + 7) // 8 * 8
    list0, list1 = 8 + 16 * m, 8 + 8 * m

    def node_bytes(level):
        return vector_part + list0 + level * list1

    def list_at(level):
        return vector_part if level == 0 else vector_part + list0 + (level - 1) * list1

    def word(r, off):
        return int.from_bytes(r[off:off + 8].tobytes(), "little")

    def mode_word(r, i):  # RegionHeader::mode_words at 128
        return word(r, 128 + 8 * i)

    nodes = {}  # raw RemotePtr -> (level, deleted, [lists], generation)
    for mi, r in enumerate(regs):
        bump = mode_word(r, 0)
        at = mode_word(r, 16) + (mode_word(r, 17) * 16 + 63) // 64 * 64  # records follow the reuse log
        while at < bump:
            h = word(r, at)
            if h >> 48 != MAGIC:
                at += 64
                continue
            level = (h >> 8) & 0xff
            lists = []
            for lv in range(level + 1):
                o = at + list_at(lv)
                count = int.from_bytes(r[o:o + 4].tobytes(), "little")
                lists.append(np.frombuffer(r[o + 8:o + 8 + 8 * count].tobytes(), dtype=np.uint64))
            nodes[(mi << 48) | at] = (level, bool(h & 2), lists, (h >> 16) & 0xffffffff)
            at += (node_bytes(level) + 63) // 64 * 64
    entry = mode_word(regs[0], 1)
    live = [k for k, v in nodes.items() if not v[1]]
    deg0 = np.array([len(nodes[k][2][0]) for k in live])
    indeg0 = Counter(int(x) for k in live for x in nodes[k][2][0])
    seen, stack = {entry}, [entry]
    while stack:  # every level's lists, through deleted nodes too (searches expand them)
        v = nodes.get(stack.pop())
        for lst in (v[2] if v else []):
            for x in map(int, lst):
                if x not in seen:
                    seen.add(x)
                    stack.append(x)
    levels = np.array([nodes[k][0] for k in live])
    upper = {}
    for lv in range(1, int(levels.max()) + 1):
        at_lv = [k for k in live if nodes[k][0] >= lv]
        ind = Counter(int(x) for k in nodes if nodes[k][0] >= lv for x in nodes[k][2][lv])
        upper[lv] = {"nodes": len(at_lv), "mean_degree": float(np.mean([len(nodes[k][2][lv]) for k in at_lv])),
                     "named_by_none": sum(1 for k in at_lv if ind.get(k, 0) == 0 and k != entry)}
    return {"records": len(nodes), "live": len(live), "level0_mean_degree": float(deg0.mean()),
            "level0_empty": int((deg0 == 0).sum()), "level0_named_by_none": sum(1 for k in live if indeg0.get(k, 0) == 0),
            "unreachable": sum(1 for k in live if k not in seen),
            "edges_to_deleted": sum(1 for k in live for lst in nodes[k][2] for x in lst if nodes.get(int(x), (0, True))[1]),
            "entry_deleted": nodes[entry][1], "entry_level": nodes[entry][0], "upper": upper,
            "by_generation": dict(sorted(Counter(nodes[k][3] for k in live).items()))}
