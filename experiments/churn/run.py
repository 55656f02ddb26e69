#!/usr/bin/python3
"""Churn: deletes, upserts and inserts into deleted records, in shine (see README.md here).

On SET (wordnet: 50,000 x 384 sentence embeddings, inner product), 2 memnodes over --provider
(cxl) with the wire model --wire (rdma-100g), M 16, efConstruction 100:

  initial     rows [0, N0) under ids = row numbers (`build --ids`, an id index), 2 computenodes x
              2 threads, stored (--store-index) and served again by fresh memnodes for each part
  churn F     for F in --fractions: delete F x N0 random live ids (`delete --ids`, 2 computenodes),
              insert as many new rows under new ids (`insert --data --ids`, 2 computenodes: these
              reuse the deleted records), then `query --ef-search 64` of --queries queries against
              the exact top 10 of the live set (numpy, brute force): recall@10, and the same live
              set built afresh on fresh memnodes, queried the same way
  rounds      --rounds rounds of 30 % churn in a row: the memnodes' bytes in use (the bump words)
              after each, recall@10 after the last against a fresh build, then `upsert` of 10 % of
              the live ids with other vectors (2 computenodes): upserts/s
  hnswlib     the same operations on hnswlib (Debian's python3-hnswlib 0.6.2: mark_deleted, then
              add_items of the new rows; 0.6.2 predates replace_deleted, so its index grows), 2
              threads, same M, efConstruction and efSearch: recall@10, deletes/s, inserts/s, elements

Every process started here is stopped at the end, also on errors.

  experiments/churn/run.py [--set wordnet] [--n0 30000] [--fractions 0.1,0.3,0.5] [--rounds 5]
                           [--queries 1000] [--provider cxl] [--wire rdma-100g] [--quick]
"""
import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dmh  # noqa: E402

HERE = Path(__file__).resolve().parent
M, EFC, EF, K = 16, 100, 64, 10


def read_fvecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    d = int(raw[0])
    return raw.reshape(-1, d + 1)[:, 1:].view(np.float32).copy()


def read_bvecs_as_float(path):
    raw = np.fromfile(path, dtype=np.uint8)
    d = int(np.frombuffer(raw[:4].tobytes(), dtype=np.int32)[0])
    return raw.reshape(-1, d + 4)[:, 4:].astype(np.float32)


def write_vecs(path, x, dtype):
    x = np.ascontiguousarray(x, dtype=dtype)
    head = np.full((x.shape[0], 1), x.shape[1], dtype=np.int32)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(np.hstack([head.view(np.uint8).reshape(x.shape[0], 4),
                           x.view(np.uint8).reshape(x.shape[0], -1)]).tobytes())
    tmp.replace(path)


def write_ids(path, ids):
    Path(path).write_text("".join(f"{int(i)}\n" for i in ids))


def exact_top(base, ids, queries, metric):
    """The ids of each query's K nearest in `base` (rows named by `ids`), by brute force."""
    out = np.empty((queries.shape[0], K), dtype=np.int32)
    for at in range(0, queries.shape[0], 100):
        q = queries[at:at + 100]
        if metric == "ip":
            score = q @ base.T
        else:
            score = -((q * q).sum(1)[:, None] - 2 * q @ base.T + (base * base).sum(1)[None, :])
        top = np.argpartition(-score, K, axis=1)[:, :K]
        order = np.take_along_axis(score, top, 1).argsort(1)[:, ::-1]
        out[at:at + 100] = ids[np.take_along_axis(top, order, 1)]
    return out


class Run:
    def __init__(self, a, work):
        self.a, self.work = a, work
        base, q, _, self.metric = dmh.dataset_files(a.set, work)
        self.x = read_bvecs_as_float(base) if str(base).endswith(".bvecs") else read_fvecs(base)
        self.q = read_fvecs(q)[:a.queries]
        self.qpath = work / "queries.fvecs"
        write_vecs(self.qpath, self.q, np.float32)

    # ---- files
    def rows_file(self, name, rows):
        p = self.work / f"{name}.fvecs"
        write_vecs(p, self.x[rows], np.float32)
        return p

    def workload(self, name, live):
        """A workload of the queries against the exact top 10 of `live` (id -> row)."""
        ids = np.fromiter(live.keys(), dtype=np.int64)
        rows = np.fromiter(live.values(), dtype=np.int64)
        gt = exact_top(self.x[rows], ids, self.q, self.metric)
        gtp = self.work / f"{name}_gt.ivecs"
        write_vecs(gtp, gt, np.int32)
        wl = self.work / f"{name}.wl"
        dmh.run([dmh.BIN / "workload", "--queries", self.qpath, "--groundtruth", gtp, "--dist", "uniform",
                 "--count", self.q.shape[0], "--warmup", min(100, self.q.shape[0] // 10), "--seed", 3, "--out", wl])
        return wl

    # ---- processes
    def memnodes(self, name, load=None, store=None):
        args = ["--store-dir", store] if store else []
        return dmh.Memnodes(None if load else 2, self.a.provider, self.a.region, self.work / name / "mn", load=load,
                            args=args)

    def cn(self, mn, sub, args, name, num_cns=2):
        rep = self.work / f"{name}.json"
        r, _ = dmh.computenodes(mn, self.a.provider, num_cns, sub, [str(x) for x in args], rep,
                                logdir=self.work / name, timeout=self.a.timeout, wire=self.a.wire)
        return r

    def build(self, mn, live, name, store=None):
        rows = list(live.values())
        data = self.rows_file(name + "_data", rows)
        idf = self.work / f"{name}_ids.txt"
        write_ids(idf, live.keys())
        args = ["--data", data, "--ids", idf, "--m", M, "--ef-construction", EFC, "--metric", self.metric,
                "--threads", 2, "--coroutines", 4, "--id-capacity", 2 * self.a.n0]
        if store:
            args += ["--store-index", store]
        return self.cn(mn, "build", args, name)

    def query(self, mn, wl, name):
        r = self.cn(mn, "query", ["--workload", wl, "--k", K, "--ef-search", EF, "--threads", 2, "--coroutines", 4],
                    name, num_cns=1)
        return r["runs"][0]

    def churn(self, mn, live, frac, pool, rng, round_no, name):
        """Deletes FRAC x N0 live ids and inserts as many rows of POOL (rows not live) under new ids."""
        n = int(frac * self.a.n0)
        gone = rng.sample(sorted(live), n)
        idf = self.work / f"{name}_del.txt"
        write_ids(idf, gone)
        d = self.cn(mn, "delete", ["--ids", idf, "--threads", 2, "--coroutines", 4], name + "_delete")
        for i in gone:
            del live[i]
        rows = rng.sample(sorted(pool), n)
        new_ids = [r + self.x.shape[0] * (round_no + 1) for r in rows]
        data = self.rows_file(name + "_new", rows)
        idf = self.work / f"{name}_new.txt"
        write_ids(idf, new_ids)
        ins = self.cn(mn, "insert", ["--data", data, "--ids", idf, "--threads", 2, "--coroutines", 4],
                      name + "_insert")
        for i, r in zip(new_ids, rows):
            live[i] = r
        return d, ins, gone, rows

    def bytes_used(self, report):
        return sum(m["bytes_used"] for m in report["memnode_usage"])

    def fresh_recall(self, live, wl, name):
        with self.memnodes(name + "_fresh") as mn:
            b = self.build(mn, live, name + "_fresh_build")
            q = self.query(mn, wl, name + "_fresh_query")
        return q["recall"], b


def hnswlib_part(run, fractions, rounds, initial, rng_seed):
    import hnswlib
    a, x = run.a, run.x
    space = "ip" if run.metric == "ip" else "l2"
    out = {"version": "0.6.2 (python3-hnswlib; mark_deleted, no replace_deleted)", "fractions": {}}

    def fresh_index(capacity):
        idx = hnswlib.Index(space=space, dim=x.shape[1])
        idx.init_index(max_elements=capacity, ef_construction=EFC, M=M, random_seed=100)
        idx.set_num_threads(2)
        return idx

    def recall(idx, live):
        ids = np.fromiter(live.keys(), dtype=np.int64)
        rows = np.fromiter(live.values(), dtype=np.int64)
        gt = exact_top(x[rows], ids, run.q, run.metric)
        idx.set_ef(EF)
        got, _ = idx.knn_query(run.q, k=K, num_threads=2)
        return float(np.mean([len(set(g.tolist()) & set(t.tolist())) / K for g, t in zip(got, gt)]))

    def load_initial():
        idx = fresh_index(a.n0 * (1 + rounds))
        t0 = time.time()
        idx.add_items(x[list(initial.values())], np.fromiter(initial.keys(), dtype=np.int64), num_threads=2)
        return idx, len(initial) / (time.time() - t0)

    for frac in fractions:
        rng = random.Random(rng_seed)
        idx, ins0 = load_initial()
        out["inserts_per_s_initial"] = ins0
        live = dict(initial)
        n = int(frac * a.n0)
        gone = rng.sample(sorted(live), n)
        t0 = time.time()
        for i in gone:
            idx.mark_deleted(i)
        dels = n / (time.time() - t0)
        for i in gone:
            del live[i]
        pool = sorted(set(range(x.shape[0])) - set(live.values()))
        rows = rng.sample(pool, n)
        new_ids = np.array([r + x.shape[0] for r in rows], dtype=np.int64)
        t0 = time.time()
        idx.add_items(x[rows], new_ids, num_threads=2)
        ins = n / (time.time() - t0)
        for i, r in zip(new_ids.tolist(), rows):
            live[i] = r
        r_after = recall(idx, live)
        fresh = fresh_index(len(live))
        fresh.add_items(x[list(live.values())], np.fromiter(live.keys(), dtype=np.int64), num_threads=2)
        out["fractions"][str(frac)] = {"recall": r_after, "fresh_recall": recall(fresh, live), "deletes_per_s": dels,
                                       "inserts_per_s": ins, "elements": idx.get_current_count(),
                                       "live": len(live)}
        dmh.log(f"  hnswlib churn {frac}: recall {r_after:.4f}, elements {idx.get_current_count()} for {len(live)} live")
    # rounds of 30 %: elements grow (no reuse in 0.6.2)
    rng = random.Random(rng_seed + 1)
    idx, _ = load_initial()
    live = dict(initial)
    elements = [idx.get_current_count()]
    for r in range(rounds):
        n = int(0.3 * a.n0)
        gone = rng.sample(sorted(live), n)
        for i in gone:
            idx.mark_deleted(i)
            del live[i]
        pool = sorted(set(range(x.shape[0])) - set(live.values()))
        rows = rng.sample(pool, n)
        new_ids = np.array([row + x.shape[0] * (r + 1) for row in rows], dtype=np.int64)
        idx.add_items(x[rows], new_ids, num_threads=2)
        for i, row in zip(new_ids.tolist(), rows):
            live[i] = row
        elements.append(idx.get_current_count())
    fresh = fresh_index(len(live))
    fresh.add_items(x[list(live.values())], np.fromiter(live.keys(), dtype=np.int64), num_threads=2)
    out["rounds"] = {"elements": elements, "memory_ratio": elements[-1] / elements[0], "recall": recall(idx, live),
                     "fresh_recall": recall(fresh, live)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="wordnet")
    ap.add_argument("--n0", type=int, default=30000)
    ap.add_argument("--fractions", default="0.1,0.3,0.5")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--provider", default="cxl")
    ap.add_argument("--wire", default="rdma-100g")
    ap.add_argument("--region", default="1GiB")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--bin", default=str(dmh.BIN))
    ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "churn"))
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--quick", action="store_true", help="n0 4000, 200 queries, 2 rounds (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.n0, a.queries, a.rounds = 4000, 200, 2
    dmh.BIN = Path(a.bin).resolve()
    work = Path(a.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fractions = [float(f) for f in a.fractions.split(",")]
    t_start = time.time()
    run = Run(a, work)
    if a.n0 + int(max(fractions) * a.n0) > run.x.shape[0]:
        raise SystemExit(f"--n0 {a.n0}: the set has {run.x.shape[0]} rows, too few for the largest fraction")
    initial = {i: i for i in range(a.n0)}
    res = {"set": a.set, "n0": a.n0, "dim": int(run.x.shape[1]), "metric": run.metric, "provider": a.provider,
           "wire": a.wire, "m": M, "ef_construction": EFC, "ef_search": EF, "queries": int(run.q.shape[0]),
           "command": dmh.command_line(), "fractions": {}}

    dmh.log(f"initial build: {a.n0} rows of {a.set}")
    store = work / "initial_images"
    store.mkdir()
    with run.memnodes("initial", store=store) as mn:
        b0 = run.build(mn, initial, "initial", store=store)
        wl0 = run.workload("initial", initial)
        q0 = run.query(mn, wl0, "initial_query")
    images = sorted(store.glob("memnode-*.img"))
    res["initial"] = {"inserts_per_s": b0["inserts_per_s"], "seconds": b0["seconds"], "recall": q0["recall"],
                      "qps": q0["qps"], "bytes_used": run.bytes_used(b0)}
    dmh.log(f"  {b0['inserts_per_s']:.0f} inserts/s, recall {q0['recall']:.4f}, {run.bytes_used(b0) >> 20} MiB")

    for frac in fractions:
        rng = random.Random(11)
        live = dict(initial)
        name = f"churn{int(frac * 100)}"
        dmh.log(f"churn {frac:.0%}: delete and insert {int(frac * a.n0)}")
        with run.memnodes(name, load=images) as mn:
            pool = set(range(run.x.shape[0])) - set(live.values())
            d, ins, _, _ = run.churn(mn, live, frac, pool, rng, 0, name)
            wl = run.workload(name, live)
            q = run.query(mn, wl, name + "_query")
        fresh, _ = run.fresh_recall(live, wl, name)
        res["fractions"][str(frac)] = {"recall": q["recall"], "fresh_recall": fresh, "qps": q["qps"],
                                       "deletes_per_s": d["deletes_per_s"], "inserts_per_s": ins["inserts_per_s"],
                                       "deleted": d["deleted"], "inserted": ins["inserted"],
                                       "records_reused": ins.get("records_reused"),
                                       "bytes_used": run.bytes_used(ins)}
        dmh.log(f"  recall {q['recall']:.4f} (fresh build {fresh:.4f}); {d['deletes_per_s']:.0f} deletes/s, "
                f"{ins['inserts_per_s']:.0f} inserts/s into deleted records; {run.bytes_used(ins) >> 20} MiB")

    dmh.log(f"{a.rounds} rounds of 30 % churn")
    rng = random.Random(12)
    live = dict(initial)
    used = [res["initial"]["bytes_used"]]
    rounds = []
    with run.memnodes("rounds", load=images) as mn:
        for r in range(a.rounds):
            pool = set(range(run.x.shape[0])) - set(live.values())
            d, ins, _, _ = run.churn(mn, live, 0.3, pool, rng, r, f"round{r}")
            used.append(run.bytes_used(ins))
            rounds.append({"deletes_per_s": d["deletes_per_s"], "inserts_per_s": ins["inserts_per_s"],
                           "bytes_used": used[-1]})
            dmh.log(f"  round {r + 1}: {used[-1] / used[0]:.3f}x the initial bytes")
        wl = run.workload("rounds", live)
        q = run.query(mn, wl, "rounds_query")
        # upserts: 10 % of the live ids get the vectors of rows not live
        up_ids = rng.sample(sorted(live), a.n0 // 10)
        pool = sorted(set(range(run.x.shape[0])) - set(live.values()))
        up_rows = rng.sample(pool, len(up_ids))
        data = run.rows_file("upsert_data", up_rows)
        idf = work / "upsert_ids.txt"
        write_ids(idf, up_ids)
        u = run.cn(mn, "upsert", ["--data", data, "--ids", idf, "--threads", 2, "--coroutines", 4], "upsert")
    fresh, _ = run.fresh_recall(live, wl, "rounds")
    res["rounds"] = {"bytes_used": used, "memory_ratio": used[-1] / used[0], "per_round": rounds,
                     "recall": q["recall"], "fresh_recall": fresh, "upserts_per_s": u["inserts_per_s"],
                     "upsert_replaced": u["replaced"]}
    dmh.log(f"  memory {used[-1] / used[0]:.3f}x, recall {q['recall']:.4f} (fresh {fresh:.4f}), "
            f"{u['inserts_per_s']:.0f} upserts/s")

    dmh.log("hnswlib, the same operations")
    res["hnswlib"] = hnswlib_part(run, fractions, a.rounds, initial, 11)
    res["seconds"] = time.time() - t_start
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    dmh.log(f"wrote {a.out} ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
