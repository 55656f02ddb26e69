#!/usr/bin/python3
"""Rounds of 30 % churn on one shine index (delete, consolidate, insert as many under new ids), the
recall@10 of the live set after each at efSearch 64 and 256, and the graph's statistics
(graphstat.py) after each step; then a fresh build of the last live set, queried and read the
same way. A diagnostic beside run.py: 2 memnodes over cxl without a wire model, 2 computenodes.

  experiments/churn/rounds.py [--set syn1m] [--data-dir DIR] [--n0 200000] [--rounds 5]
                              [--no-consolidate] [--bin build/bin] [--work DIR]
"""
import argparse
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphstat  # noqa: E402
import run as churn  # noqa: E402

dmh = churn.dmh


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="syn1m")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--n0", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--no-consolidate", action="store_true")
    ap.add_argument("--deletes-only", action="store_true",
                    help="rounds of deletes (and consolidation) without the inserts: the live set shrinks by 30 %% a round")
    ap.add_argument("--upper-ef", default="",
                    help="comma-separated --upper-ef values also measured at efSearch 64 (e.g. 4,16)")
    ap.add_argument("--bin", default=str(dmh.BIN))
    ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "churn_rounds"))
    a0 = ap.parse_args()
    a = argparse.Namespace(set=a0.set, n0=a0.n0, rounds=a0.rounds, queries=a0.queries, provider="cxl", wire="none",
                           region="1GiB", timeout=1800, data_dir=a0.data_dir, shine_consolidate=not a0.no_consolidate,
                           shine_alpha=1.0, shine_upper_ef=1)
    dmh.BIN = Path(a0.bin).resolve()
    work = Path(a0.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run = churn.Run(a, work)
    dim = run.x.shape[1]
    out = {"command": dmh.command_line(), "rounds": []}
    upper = [int(u) for u in a0.upper_ef.split(",") if u]
    costs = out["upper_ef"] = {}  # run name -> upper ef -> recall, READs and bytes per query

    def recall(mn, wl, name):
        """recall@10 at efSearch 64 and 256 with greedy upper levels, and at 64 with each --upper-ef;
        the READs and bytes per query of each efSearch-64 run go to `cost`."""
        out, cost = [], {}
        for ef, up in [(64, 1), (256, 1)] + [(64, u) for u in upper]:
            r = run.cn(mn, "query", ["--workload", wl, "--k", churn.K, "--ef-search", ef, "--upper-ef", up,
                                     "--threads", 2, "--coroutines", 4], f"{name}_ef{ef}_up{up}", num_cns=1)["runs"][0]
            out.append(r["recall"])
            if ef == 64:
                cost[up] = {"recall": r["recall"], "reads": r["per_query"]["reads"], "bytes": r["per_query"]["bytes"]}
        costs[name] = cost
        return out

    def ups(r):
        return "".join(f", upper ef {u}: {x:.4f}" for u, x in zip(upper, r[2:]))

    live = {i: i for i in range(a.n0)}
    rng = random.Random(12)
    with run.memnodes("rounds") as mn:
        run.build(mn, live, "initial")
        r = recall(mn, run.workload("r0", live), "r0")
        out["initial"] = {"recall": r, "graph": graphstat.stats(mn, dim)}
        dmh.log(f"built: recall@10 {r[0]:.4f} (efSearch 256: {r[1]:.4f}{ups(r)})")
        for i in range(a.rounds):
            if a0.deletes_only:
                gone = rng.sample(sorted(live), int(0.3 * len(live)))
                idf = work / f"round{i}_del.txt"
                churn.write_ids(idf, gone)
                run.cn(mn, "delete", ["--ids", idf, "--threads", 2, "--coroutines", 4], f"round{i}_delete")
                if a.shine_consolidate:
                    run.cn(mn, "consolidate", ["--threads", 2, "--coroutines", 4], f"round{i}_consolidate")
                for x in gone:
                    del live[x]
                ins = {"inserts_per_s": None}
            else:
                d, ins, _, _ = run.churn(mn, live, 0.3, run.not_live(live), rng, i, f"round{i}")
            r = recall(mn, run.workload(f"r{i + 1}", live), f"r{i + 1}")
            g = graphstat.stats(mn, dim)
            out["rounds"].append({"recall": r, "graph": g, "inserts_per_s": ins["inserts_per_s"]})
            dmh.log(f"round {i + 1}: recall@10 {r[0]:.4f} (efSearch 256: {r[1]:.4f}{ups(r)}); "
                    + json.dumps({k: g[k] for k in ("level0_mean_degree", "level0_empty", "unreachable")} if g else {}))
        wl = run.workload("last", live)
    with run.memnodes("fresh") as mn:
        run.build(mn, live, "fresh")
        r = recall(mn, wl, "fresh")
        out["fresh"] = {"recall": r, "graph": graphstat.stats(mn, dim)}
        dmh.log(f"fresh build of the last live set: recall@10 {r[0]:.4f} (efSearch 256: {r[1]:.4f}{ups(r)})")
    (work / "rounds.json").write_text(json.dumps(out, indent=1) + "\n")
    dmh.log(f"wrote {work / 'rounds.json'}")


if __name__ == "__main__":
    main()
