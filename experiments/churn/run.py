#!/usr/bin/python3
"""Churn: deletes, upserts and inserts into deleted records, in shine and d-HNSW (see README.md here).

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
  hnswlib     the same operations from the same files on hnswlib (tools/hnswlib-bench --step:
              Debian's hnswlib 0.6.2, markDelete, and inserts into deleted elements as 0.7's
              replace_deleted), 2 threads, same M, efConstruction and efSearch: recall@10 against
              its own fresh build, deletes/s, inserts/s, upserts/s, elements
  dhnsw       (`--mode dhnsw`, --dhnsw-partitions 16, M 16, efConstruction 100, gaps 10 %) for F in
              --fractions: the online build of rows [0, N0) under ids = row numbers (computenode 0),
              `delete` of F x N0 live ids and `insert` of as many new rows under new ids (2
              computenodes each), `query --probe 4 (and 8) --ef-search 64 --batch 500`: recall@10 of the live
              set (a) as it is (the rebuilds the deletes and inserts started by themselves counted),
              (b) after `rebuild` (and after --dhnsw-rebuilds - 1 more), against a fresh build of the same live set
              on fresh memnodes; `upsert` of 10 % of the live ids (2 computenodes) and a rebuild after
              it; the live epoch's area in the memnodes (reports; the region headers and control
              block read from the memnodes' memfd over cxl)

Every process started here is stopped at the end, also on errors. --modes shine,dhnsw picks the
parts; the results file keeps the parts not run.

  experiments/churn/run.py [--modes shine,dhnsw] [--set wordnet] [--n0 30000] [--fractions 0.1,0.3,0.5]
                           [--rounds 5] [--queries 1000] [--provider cxl] [--wire rdma-100g]
                           [--dhnsw-partitions 16] [--dhnsw-probe 4,8] [--dhnsw-batch 500]
                           [--dhnsw-rebuilds 5] [--quick]
"""
import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
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
        base, q, _, self.metric = dmh.dataset_files(a.set, Path(a.data_dir).resolve() if a.data_dir else work)
        self.x = read_bvecs_as_float(base) if str(base).endswith(".bvecs") else read_fvecs(base)
        self.q = read_fvecs(q)[:a.queries]
        self.qpath = work / "queries.fvecs"
        write_vecs(self.qpath, self.q, np.float32)

    # ---- files
    def rows_file(self, name, rows):
        p = self.work / f"{name}.fvecs"
        write_vecs(p, self.x[rows], np.float32)
        return p

    def data_and_ids(self, name, rows, ids):
        """ROWS as NAME.fvecs and IDS as NAME_ids.txt: the --data and --ids of a build, insert or upsert."""
        idf = self.work / f"{name}_ids.txt"
        write_ids(idf, ids)
        return self.rows_file(name, rows), idf

    def not_live(self, live):
        """The rows no live id holds, in order."""
        return sorted(set(range(self.x.shape[0])) - set(live.values()))

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
        data, idf = self.data_and_ids(name + "_data", list(live.values()), live.keys())
        args = ["--data", data, "--ids", idf, "--m", M, "--ef-construction", EFC, "--metric", self.metric,
                "--threads", 2, "--coroutines", 4, "--id-capacity", 2 * self.a.n0]
        if store:
            args += ["--store-index", store]
        return self.cn(mn, "build", args, name)

    def query(self, mn, wl, name):
        """The run of `query` (greedy upper levels); with --shine-upper-ef U also `upper`: recall, READs
        and bytes per query of the same queries with `--upper-ef U`."""
        args = ["--workload", wl, "--k", K, "--ef-search", EF, "--threads", 2, "--coroutines", 4]
        r = self.cn(mn, "query", args, name, num_cns=1)["runs"][0]
        if self.a.shine_upper_ef > 1:
            u = self.cn(mn, "query", args + ["--upper-ef", self.a.shine_upper_ef], name + "_upper", num_cns=1)["runs"][0]
            r["upper"] = {"upper_ef": self.a.shine_upper_ef, "recall": u["recall"], "qps": u["qps"],
                          "reads": u["per_query"]["reads"], "bytes": u["per_query"]["bytes"],
                          "greedy_reads": r["per_query"]["reads"], "greedy_bytes": r["per_query"]["bytes"]}
        return r

    def churn(self, mn, live, frac, pool, rng, round_no, name):
        """Deletes FRAC x N0 live ids and inserts as many rows of POOL (rows not live) under new ids."""
        n = int(frac * self.a.n0)
        gone = rng.sample(sorted(live), n)
        idf = self.work / f"{name}_del.txt"
        write_ids(idf, gone)
        d = self.cn(mn, "delete", ["--ids", idf, "--threads", 2, "--coroutines", 4], name + "_delete")
        if self.a.shine_consolidate:  # live lists rid of deleted nodes before the inserts reuse them
            c = self.cn(mn, "consolidate", ["--threads", 2, "--coroutines", 4, "--alpha", self.a.shine_alpha],
                        name + "_consolidate")
            d["consolidate"] = {k: c[k] for k in ("nodes", "nodes_changed", "lists_rewritten", "seconds", "nodes_per_s")}
            dmh.log(f"  consolidated: {c['nodes_changed']} of {c['nodes']} nodes linked to deleted ones, "
                    f"{c['seconds']:.1f} s")
        for i in gone:
            del live[i]
        rows = rng.sample(sorted(pool), n)
        new_ids = [r + self.x.shape[0] * (round_no + 1) for r in rows]
        data, idf = self.data_and_ids(name + "_new", rows, new_ids)
        ins = self.cn(mn, "insert", ["--data", data, "--ids", idf, "--threads", 2, "--coroutines", 4],
                      name + "_insert")
        for i, r in zip(new_ids, rows):
            live[i] = r
        return d, ins, gone, rows

    def bytes_used(self, report):
        return sum(m["bytes_used"] for m in report["memnode_usage"])

    def fresh_recall(self, live, wl, name):
        """The query run (Run.query) on a fresh build of `live`, and the build's report."""
        with self.memnodes(name + "_fresh") as mn:
            b = self.build(mn, live, name + "_fresh_build")
            q = self.query(mn, wl, name + "_fresh_query")
        return q, b


def hnswlib_part(run, fractions, rounds):
    """The shine part's deletes, inserts and upserts, from its files, on hnswlib (tools/hnswlib-bench
    --step: Debian's hnswlib 0.6.2 with markDelete, and inserts that reuse deleted elements as
    0.7's replace_deleted does), 2 threads, same M, efConstruction and efSearch."""
    w = run.work
    out = {"version": "0.6.2 (libhnswlib-dev; markDelete, replace_deleted as in 0.7 via hnswlib-bench --step)",
           "fractions": {}}

    def bench(name, base, steps, gt):
        rep = w / f"hnswlib_{name}.json"
        args = [dmh.BIN / "hnswlib-bench", "--base", f"{base}.fvecs", "--ids", f"{base}_ids.txt", "--queries",
                run.qpath, "--groundtruth", gt, "--metric", run.metric, "--m", M, "--ef-construction", EFC,
                "--ef-search", EF, "--k", K, "--threads", 2, "--json", rep]
        for st in steps:
            args += ["--step", st]
        dmh.run([str(x) for x in args])
        return json.loads(rep.read_text())

    def churn_steps(name):
        return [f"delete:{w}/{name}_del.txt", f"insert:{w}/{name}_new.fvecs:{w}/{name}_new_ids.txt"]

    init = w / "initial_data"
    for frac in fractions:
        name = f"churn{int(frac * 100)}"
        r = bench(name, init, churn_steps(name), w / f"{name}_gt.ivecs")
        fresh = bench(name + "_fresh", w / f"{name}_fresh_build_data", [], w / f"{name}_gt.ivecs")
        out["inserts_per_s_initial"] = r["n"] / r["build_seconds"]
        out["fractions"][str(frac)] = {"recall": r["runs"][0]["recall"], "fresh_recall": fresh["runs"][0]["recall"],
                                       "deletes_per_s": r["steps"][0]["per_s"], "inserts_per_s": r["steps"][1]["per_s"],
                                       "reused": r["steps"][1]["reused"], "elements": r["elements"],
                                       "element_bytes": r["element_bytes"]}
        dmh.log(f"  hnswlib churn {frac}: recall {r['runs'][0]['recall']:.4f} (fresh {fresh['runs'][0]['recall']:.4f}), "
                f"{r['elements']} elements")
    steps = [st for i in range(rounds) for st in churn_steps(f"round{i}")]
    r = bench("rounds", init, steps + ["query", f"upsert:{w}/upsert.fvecs:{w}/upsert_ids.txt"], w / "rounds_gt.ivecs")
    fresh = bench("rounds_fresh", w / "rounds_fresh_build_data", [], w / "rounds_gt.ivecs")
    out["rounds"] = {"elements": [st["elements"] for st in r["steps"]], "element_bytes": r["element_bytes"],
                     "recall": r["runs"][0]["recall"], "fresh_recall": fresh["runs"][0]["recall"],
                     "deletes_per_s": [st["per_s"] for st in r["steps"] if st["op"] == "delete"],
                     "inserts_per_s": [st["per_s"] for st in r["steps"] if st["op"] == "insert"],
                     "upserts_per_s": r["steps"][-1]["per_s"], "upserted": r["steps"][-1]["done"]}
    if (w / "upserted_gt.ivecs").exists():
        u = bench("upserted", init, steps + [f"upsert:{w}/upsert.fvecs:{w}/upsert_ids.txt"], w / "upserted_gt.ivecs")
        uf = bench("upserted_fresh", w / "upserted_fresh_build_data", [], w / "upserted_gt.ivecs")
        out["rounds"]["after_upserts"] = {"recall": u["runs"][0]["recall"], "fresh_recall": uf["runs"][0]["recall"]}
    dmh.log(f"  hnswlib rounds: recall {r['runs'][0]['recall']:.4f} (fresh {fresh['runs'][0]['recall']:.4f}), "
            f"elements {out['rounds']['elements']}")
    return out


def upper_part(q, fresh_q):
    """With --shine-upper-ef: the churned index's and the fresh build's recall and cost with it."""
    if "upper" not in q:
        return {}
    return {"upper": dict(q["upper"], fresh_recall=fresh_q["upper"]["recall"],
                          fresh_reads=fresh_q["upper"]["reads"], fresh_greedy_reads=fresh_q["upper"]["greedy_reads"])}


def shine_part(run, a, work, fractions, initial):
    """The shine part (initial build, churn F, rounds, upserts, hnswlib): the top-level keys of results.json."""
    t_start = time.time()
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
            pool = run.not_live(live)
            d, ins, _, _ = run.churn(mn, live, frac, pool, rng, 0, name)
            wl = run.workload(name, live)
            q = run.query(mn, wl, name + "_query")
        fq, _ = run.fresh_recall(live, wl, name)
        fresh = fq["recall"]
        res["fractions"][str(frac)] = {"recall": q["recall"], "fresh_recall": fresh, "qps": q["qps"],
                                       **upper_part(q, fq),
                                       "deletes_per_s": d["deletes_per_s"], "inserts_per_s": ins["inserts_per_s"],
                                       "deleted": d["deleted"], "inserted": ins["inserted"],
                                       "records_reused": ins.get("records_reused"),
                                       "consolidate": d.get("consolidate"),
                                       "bytes_used": run.bytes_used(ins)}
        if "upper" in q:
            dmh.log(f"  upper ef {a.shine_upper_ef}: recall {q['upper']['recall']:.4f} (fresh build "
                    f"{fq['upper']['recall']:.4f}), {q['upper']['reads']:.0f} READs/query (greedy {q['upper']['greedy_reads']:.0f})")
        dmh.log(f"  recall {q['recall']:.4f} (fresh build {fresh:.4f}); {d['deletes_per_s']:.0f} deletes/s, "
                f"{ins['inserts_per_s']:.0f} inserts/s into deleted records; {run.bytes_used(ins) >> 20} MiB")

    dmh.log(f"{a.rounds} rounds of 30 % churn")
    rng = random.Random(12)
    live = dict(initial)
    used = [res["initial"]["bytes_used"]]
    rounds = []
    with run.memnodes("rounds", load=images) as mn:
        for r in range(a.rounds):
            pool = run.not_live(live)
            d, ins, _, _ = run.churn(mn, live, 0.3, pool, rng, r, f"round{r}")
            used.append(run.bytes_used(ins))
            rounds.append({"deletes_per_s": d["deletes_per_s"], "inserts_per_s": ins["inserts_per_s"],
                           "bytes_used": used[-1]})
            dmh.log(f"  round {r + 1}: {used[-1] / used[0]:.3f}x the initial bytes")
        wl = run.workload("rounds", live)
        q = run.query(mn, wl, "rounds_query")
        # upserts: 10 % of the live ids get the vectors of rows not live
        up_ids = rng.sample(sorted(live), a.n0 // 10)
        up_rows = rng.sample(run.not_live(live), len(up_ids))
        data, idf = run.data_and_ids("upsert", up_rows, up_ids)
        u = run.cn(mn, "upsert", ["--data", data, "--ids", idf, "--threads", 2, "--coroutines", 4], "upsert")
        # the live set after the upserts: each upserted id holds its new row
        upserted = dict(live)
        upserted.update(zip(up_ids, up_rows))
        wl_up = run.workload("upserted", upserted)
        q_up = run.query(mn, wl_up, "upserted_query")
        after_upserts = {"recall": q_up["recall"], "bytes_used": run.bytes_used(u)}
        if a.shine_consolidate:  # the upserts' old vectors are deleted nodes too
            c = run.cn(mn, "consolidate", ["--threads", 2, "--coroutines", 4, "--alpha", a.shine_alpha],
                       "upserted_consolidate")
            after_upserts["consolidated_recall"] = run.query(mn, wl_up, "upserted_consolidated_query")["recall"]
            after_upserts["consolidate"] = {k: c[k] for k in ("nodes", "nodes_changed", "lists_rewritten", "seconds")}
    fq, _ = run.fresh_recall(live, wl, "rounds")
    fresh = fq["recall"]
    fq_up, _ = run.fresh_recall(upserted, wl_up, "upserted")
    after_upserts["fresh_recall"] = fq_up["recall"]
    after_upserts.update(upper_part(q_up, fq_up))
    res["rounds"] = {"bytes_used": used, "memory_ratio": used[-1] / used[0], "per_round": rounds,
                     "recall": q["recall"], "fresh_recall": fresh, **upper_part(q, fq),
                     "upserts_per_s": u["inserts_per_s"],
                     "upsert_replaced": u["replaced"], "after_upserts": after_upserts}
    dmh.log(f"  memory {used[-1] / used[0]:.3f}x, recall {q['recall']:.4f} (fresh {fresh:.4f}), "
            f"{u['inserts_per_s']:.0f} upserts/s; after them recall {q_up['recall']:.4f}"
            + (f", consolidated {after_upserts['consolidated_recall']:.4f}" if a.shine_consolidate else "")
            + f" (fresh {after_upserts['fresh_recall']:.4f})")

    if a.skip_hnswlib:
        res["seconds"] = time.time() - t_start
        return res
    dmh.log("hnswlib, the same operations")
    res["hnswlib"] = hnswlib_part(run, fractions, a.rounds)
    res["seconds"] = time.time() - t_start
    return res


# ---- d-HNSW (--mode dhnsw): the same churn on a partitioned index

# A memnode drops a computenode whose control connection is silent for --relay-timeout-ms (10 s by default);
# a CPU-bound build or rebuild on the 2 shared cores of this VM was dropped so (the computenode then reports
# "memnode ... is unreachable: control connection closed (memnode process gone)").
MN_ARGS = ["--relay-timeout-ms", 60000]
UPSERT_REPORT_BUG = "[json.exception.type_error.302] type must be number, but is"  # see dhnsw_cns (then number, object, ...)


def dhnsw_cns(run, mn, num_cns, sub, args, name):
    """Runs `computenode --mode dhnsw SUB ARGS --report WORK/NAME.json` on NUM_CNS computenodes, each with
    --report (a d-HNSW delete, insert or upsert writes one report per computenode, NAME.json.cn<i> with
    --num-cns > 1; dmh.computenodes passes --report to computenode 0 only). Logs in WORK/NAME/cn<i>.log.
    Returns (reports, one per computenode: None where none was written; outputs; wall seconds).
    An `upsert` that fails with UPSERT_REPORT_BUG after its inserts (these binaries: its summary line reads
    insert.replaced, which the insert statistics do not hold) is taken as done, without a report."""
    a, work = run.a, run.work
    report = work / f"{name}.json"
    logdir = work / name
    logdir.mkdir(parents=True, exist_ok=True)
    paths = [report] if num_cns == 1 else [Path(f"{report}.cn{i}") for i in range(num_cns)]
    for p in paths:
        p.unlink(missing_ok=True)
    procs, logs = [], []
    t0 = time.time()
    try:
        for i in range(num_cns):
            cmd = [str(x) for x in [dmh.BIN / "computenode", "--mode", "dhnsw", "--provider", a.provider, "--memnodes",
                                    mn.list, "--cn-id", i, "--num-cns", num_cns, "--wire", a.wire, sub, *args,
                                    "--report", report]]
            logs.append(logdir / f"cn{i}.log")
            with open(logs[-1], "w") as f:
                f.write(" ".join(cmd) + "\n")
                f.flush()
                procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT))
        deadline, failed_at = time.time() + a.timeout, None
        while any(p.poll() is None for p in procs):
            now = time.time()
            if now > deadline:
                raise RuntimeError(f"computenode {sub} did not finish within {a.timeout} s (logs: {logdir})")
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if failed_at is not None and now - failed_at > 10:
                break  # a peer failed: the others may wait for it
            time.sleep(0.05)
    finally:
        for p in procs:  # only the processes started here, by their Popen objects
            if p.poll() is None:
                p.kill()
                p.wait()
        dmh.shm_cleanup([p.pid for p in procs])
    wall = time.time() - t0
    outs = [f.read_text() for f in logs]
    bad = [i for i, p in enumerate(procs)
           if p.returncode != 0 and not (sub == "upsert" and p.returncode == 1 and UPSERT_REPORT_BUG in outs[i]
                                         and "dhnsw insert (computenode" in outs[i])]
    if bad:
        raise RuntimeError("".join(f"computenode {i} {sub} failed ({procs[i].returncode}):\n{outs[i][-4000:]}\n"
                                   for i in bad))
    reps = [json.loads(p.read_text()) if p.exists() else None for p in paths]
    return reps, outs, wall


SUMMARY = re.compile(r"dhnsw insert \(computenode (\d+)\): (\d+) vectors in ([0-9.]+) s \(([0-9.]+) inserts/s\)")
PUBLISHED = re.compile(r"dhnsw rebuild: epoch (\d+) published: (\d+) vectors")


def region_state(mn):
    """The memnodes' region headers and memnode 0's control block, read from the memnodes' own region
    (over cxl a memfd: /proc/<memnode pid>/fd); None when not readable (another provider)."""
    heads = []
    for p in mn.procs:
        fd = None
        try:
            for f in Path(f"/proc/{p.pid}/fd").iterdir():
                if os.readlink(f).startswith("/memfd:dmhnsw-region"):
                    fd = f
                    break
            if fd is None:
                return None
            with open(fd, "rb") as fh:
                heads.append(fh.read(4096))
        except OSError:
            return None
    out = {"memnodes": []}
    for h in heads:
        # RegionHeader (common/region.hpp): epoch @32; dhnsw mode words @128: metadata offset, size, data end
        epoch = struct.unpack_from("<Q", h, 32)[0]
        meta_off, meta_size, data_end = struct.unpack_from("<3Q", h, 128)
        out["memnodes"].append({"epoch": epoch, "metadata_offset": meta_off, "metadata_bytes": meta_size,
                                "data_end": data_end})
    # dhnsw::Control at 2048 (compute/dhnsw/control.hpp)
    _, phase, epoch, _, buf_off, buf_bytes = struct.unpack_from("<6Q", heads[0], 2048)
    cur_base, cur_end, old_base, old_end, rebuilds = struct.unpack_from("<5Q", heads[0], 2048 + 72)
    out.update({"phase": phase, "epoch": epoch, "buffer_offset": buf_off, "buffer_bytes": buf_bytes,
                "live_area": [cur_base, cur_end], "old_area": [old_base, old_end], "rebuilds": rebuilds,
                "live_area_bytes": cur_end - cur_base, "old_area_bytes": max(0, old_end - old_base),
                "data_end_max": max(m["data_end"] for m in out["memnodes"])})
    return out


def sum_reports(reps, key):
    return sum((r or {}).get(key, 0) for r in reps)


def dhnsw_part(run, fractions, initial, seed):
    """Per fraction F: a fresh online d-HNSW build of INITIAL (computenode 0), delete F x N0 live ids and
    insert as many new rows under new ids (2 computenodes), recall@10 of the live set (a) as it is, (b)
    after `rebuild`; upsert 10 % of the live ids (2 computenodes), rebuild again (it drops the upserted
    ids' old vectors: the count replaced); a fresh build of the live set on fresh memnodes."""
    a, work = run.a, run.work
    (work / "dhnsw").mkdir(exist_ok=True)
    P = a.dhnsw_partitions
    probes = [int(x) for x in str(a.dhnsw_probe).split(",")]  # the first is the main one
    t_start = time.time()
    out = {"set": a.set, "n0": a.n0, "dim": int(run.x.shape[1]), "metric": run.metric, "provider": a.provider,
           "wire": a.wire, "memnodes": 2, "partitions": P, "probe": probes[0], "probes": probes, "m": M, "ef_construction": EFC,
           "ef_search": EF, "query_batch": a.dhnsw_batch, "rebuilds_per_fraction": a.dhnsw_rebuilds, "queries": int(run.q.shape[0]), "gaps": 0.1,
           "command": dmh.command_line(), "date": time.strftime("%Y-%m-%d %H:%M"), "fractions": {}}

    def build(mn, live, name):
        data, idf = run.data_and_ids(name + "_data", list(live.values()), live.keys())
        (r,), _, wall = dhnsw_cns(run, mn, 1, "build", ["--data", data, "--ids", idf, "--metric", run.metric,
                                                         "--partitions", P, "--m", M, "--ef-construction", EFC], name)
        secs = r["seconds"]["total"] + r["write"]["seconds"]
        buf = 16 << 20  # memnode 0's insert buffer (behind its groups)
        area = sum(r["layout"]["data_end"]) - len(r["layout"]["data_end"]) * r["layout"]["metadata_offset"] - buf
        return {"vectors": r["vectors"], "seconds": secs, "inserts_per_s": r["vectors"] / secs, "wall_s": wall,
                "seconds_detail": r["seconds"], "write": r["write"], "area_bytes": area,
                "partitions": r["partitions"]["sizes"]}

    def query(mn, wl, name):
        """The workload at every probe (one process each); the first probe's numbers, and recall by probe."""
        res = {}
        for pr in probes:
            (r,), _, _ = dhnsw_cns(run, mn, 1, "query", ["--workload", wl, "--k", K, "--ef-search", EF, "--probe", pr,
                                                         "--batch", a.dhnsw_batch], f"{name}_p{pr}")
            q = r["runs"][0]
            res[pr] = {"recall": q["recall"], "recall_at_1": q["recall_at_1"], "qps": q["qps"]}
        return dict(res[probes[0]], by_probe={str(pr): res[pr]["recall"] for pr in probes})

    def merged(reps, outs, wall, what):
        """Every computenode's report of a delete, insert or upsert, merged (rate = sum / slowest)."""
        st = [r["insert"] for r in reps if r is not None]
        m = {"wall_s": wall, "rebuilds": sum(s["rebuilds"] for s in st),
             "rebuilds_published": sum(len(PUBLISHED.findall(o)) for o in outs),
             "rebuild_reports": [x for s in st for x in s["rebuild_reports"]],
             "buffered": sum(s["buffered"] for s in st), "lock_waits": sum(s["lock_waits"] for s in st)}
        if what == "delete":
            m.update(deleted=sum_reports(reps, "deleted"), not_found=sum_reports(reps, "not_found"),
                     seconds=max(r["seconds"] for r in reps))
            m["per_s"] = m["deleted"] / m["seconds"]
        elif all(r is not None for r in reps):
            m.update(done=sum(s["inserted"] for s in st), seconds=max(s["seconds"] for s in st))
            m["per_s"] = m["done"] / m["seconds"]
        else:  # upsert without reports: its summary lines (the vectors and seconds of each computenode)
            lines = [SUMMARY.search(o) for o in outs]  # seconds from the rate (printed with more digits)
            m.update(done=sum(int(x.group(2)) for x in lines),
                     seconds=max(int(x.group(2)) / float(x.group(4)) if float(x.group(4)) > 0 else float(x.group(3))
                                 for x in lines), from_summary_lines=True)
            m["per_s"] = m["done"] / m["seconds"]
        return m

    def area_after(state_rep_list, fallback):
        """The live epoch's area over all memnodes: the last published rebuild's bytes_written."""
        reps = [x for x in state_rep_list if x.get("bytes_written")]
        return max(reps, key=lambda x: x["epoch"])["bytes_written"] if reps else fallback

    def fraction(frac, attempt):
        """One fraction on fresh memnodes: its row of the results."""
        rng = random.Random(seed)
        live = dict(initial)
        n = int(frac * a.n0)
        name = f"dhnsw/churn{int(frac * 100)}" + (f"_try{attempt + 1}" if attempt else "")
        dmh.log(f"d-HNSW churn {frac:.0%}: build {a.n0}, delete and insert {n}")
        row = {"load_before": os.getloadavg()}
        with dmh.Memnodes(2, a.provider, a.region, work / name / "mn", args=MN_ARGS) as mn:
            b = build(mn, live, name + "_build")
            row["build"] = b
            row["region_built"] = region_state(mn)
            if "initial" not in out:
                wl0 = run.workload("dhnsw/initial", initial)
                out["initial"] = dict(b, **query(mn, wl0, "dhnsw/initial_query"))
                dmh.log(f"  build: {b['inserts_per_s']:.0f} vectors/s, recall {out['initial']['by_probe']} by probe")
            # deletes
            gone = rng.sample(sorted(live), n)
            idf = work / f"{name}_del.txt"
            write_ids(idf, gone)
            d = merged(*dhnsw_cns(run, mn, 2, "delete", ["--ids", idf], name + "_delete"), "delete")
            for i in gone:
                del live[i]
            # inserts of as many rows that are not live, under new ids
            rows = rng.sample(run.not_live(live), n)
            new_ids = [r + run.x.shape[0] for r in rows]
            data, idf = run.data_and_ids(name + "_new", rows, new_ids)
            ins = merged(*dhnsw_cns(run, mn, 2, "insert", ["--data", data, "--ids", idf], name + "_insert"), "insert")
            for i, r in zip(new_ids, rows):
                live[i] = r
            wl = run.workload(name, live)
            qa = query(mn, wl, name + "_query_a")
            row["region_a"] = region_state(mn)
            # (b) an explicit rebuild
            (rb,), _, rb_wall = dhnsw_cns(run, mn, 1, "rebuild", [], name + "_rebuild")
            qb = query(mn, wl, name + "_query_b")
            row["region_b"] = region_state(mn)
            # more rebuilds of the same live set: how far rebuilds differ (each partitions with seed 1 + epoch)
            again = []
            for j in range(1, a.dhnsw_rebuilds):
                (rj,), _, _ = dhnsw_cns(run, mn, 1, "rebuild", [], f"{name}_rebuild_again{j}")
                again.append(dict(query(mn, wl, f"{name}_query_b_again{j}"), epoch=rj.get("epoch"),
                                  seconds_total=rj.get("seconds_total")))
            rb_all = [qb["recall"]] + [x["recall"] for x in again]
            live_b = dict(live)
            # upserts: 10 % of the live ids get the vectors of rows that are not live
            up_ids = rng.sample(sorted(live), a.n0 // 10)
            up_rows = rng.sample(run.not_live(live), len(up_ids))
            data, idf = run.data_and_ids(name + "_up", up_rows, up_ids)
            up = merged(*dhnsw_cns(run, mn, 2, "upsert", ["--data", data, "--ids", idf], name + "_upsert"), "upsert")
            for i, r in zip(up_ids, up_rows):
                live[i] = r
            wlu = run.workload(name + "_up", live)
            qu = query(mn, wlu, name + "_query_upsert")
            # a rebuild drops the upserted ids' old vectors: deleted_dropped counts what the upserts replaced
            (rb2,), _, _ = dhnsw_cns(run, mn, 1, "rebuild", [], name + "_rebuild2")
        with dmh.Memnodes(2, a.provider, a.region, work / name / "fresh_mn", args=MN_ARGS) as mn:
            fb = build(mn, live_b, name + "_fresh_build")
            qf = query(mn, wl, name + "_fresh_query")
        area_a = area_after(d["rebuild_reports"] + ins["rebuild_reports"], b["area_bytes"])
        auto = d["rebuilds"] + ins["rebuilds"]
        row.update({
            "recall_a": qa["recall"], "recall_b": qb["recall"], "recall_b_all": rb_all,
            "recall_b_mean": sum(rb_all) / len(rb_all), "recall_b_min": min(rb_all), "recall_b_max": max(rb_all),
            "rebuilds_again": again,
            "by_probe": {str(pr): {"recall_a": qa["by_probe"][str(pr)], "recall_b": qb["by_probe"][str(pr)],
                                   "recall_b_all": [qb["by_probe"][str(pr)]] + [x["by_probe"][str(pr)] for x in again],
                                   "fresh_recall": qf["by_probe"][str(pr)],
                                   "recall_after_upsert": qu["by_probe"][str(pr)]} for pr in probes},
            "fresh_recall": qf["recall"],
            "qps_a": qa["qps"], "qps_b": qb["qps"], "fresh_qps": qf["qps"],
            "recall_after_upsert": qu["recall"],
            "rebuilds_by_themselves": auto,
            "epochs_published_by_themselves": d["rebuilds_published"] + ins["rebuilds_published"], "rebuilds_by_deletes": d["rebuilds"], "rebuilds_by_inserts": ins["rebuilds"],
            "deleted": d["deleted"], "not_found": d["not_found"], "deletes_per_s": d["per_s"],
            "inserted": ins["done"], "inserts_per_s": ins["per_s"], "buffered": ins["buffered"],
            "upserted": up["done"], "upserts_per_s": up["per_s"], "upsert_rebuilds": up["rebuilds_published"],
            "upsert_from_summary_lines": bool(up.get("from_summary_lines")),
            "rebuild2_deleted_dropped": rb2.get("deleted_dropped"), "rebuild2_vectors": rb2.get("vectors"),
            "rebuild": {k: rb.get(k) for k in ("epoch", "vectors", "deleted_dropped", "duplicates_dropped",
                                               "bytes_written", "bytes_read", "seconds", "seconds_total",
                                               "old_area_freed", "base_offset")},
            "rebuild_wall_s": rb_wall,
            "area_bytes": {"built": b["area_bytes"], "a": area_a, "b": rb.get("bytes_written"),
                           "fresh": fb["area_bytes"]},
            "delete": d, "insert": ins, "upsert": up, "fresh_build": fb})
        for k in ("delete", "insert", "upsert"):  # the rebuilds they started, in short
            row[k]["rebuild_reports"] = [{f: x.get(f) for f in ("cn_id", "epoch", "vectors", "deleted_dropped",
                                                                 "from_buffer", "merged", "bytes_written",
                                                                 "seconds_total", "old_area_freed")}
                                         for x in row[k]["rebuild_reports"]]
        row["load_after"] = os.getloadavg()
        dmh.log(f"  recall (a) {qa['recall']:.4f} after {auto} rebuilds by themselves, (b) {qb['recall']:.4f} after "
                f"rebuild ({min(rb_all):.4f}-{max(rb_all):.4f} over {len(rb_all)} rebuilds), fresh "
                f"{qf['recall']:.4f}; {d['per_s']:.0f} deletes/s, {ins['per_s']:.0f} inserts/s, "
                f"{up['per_s']:.0f} upserts/s (then {rb2.get('vectors')} vectors); area "
                f"{b['area_bytes'] >> 20} -> {area_a >> 20} -> {rb.get('bytes_written', 0) >> 20} MiB")
        for pr in probes[1:]:
            bp = row["by_probe"][str(pr)]
            dmh.log(f"  probe {pr}: recall (a) {bp['recall_a']:.4f}, (b) {bp['recall_b']:.4f} "
                    f"({min(bp['recall_b_all']):.4f}-{max(bp['recall_b_all']):.4f}), fresh {bp['fresh_recall']:.4f}")
        return row

    for frac in fractions:
        failures = []
        for attempt in range(3):  # a transient failure (dmh.TRANSIENT) starts the fraction again on fresh processes
            try:
                row = fraction(frac, attempt)
                break
            except RuntimeError as e:
                if attempt == 2 or not dmh.transient_failure(e):
                    raise
                failures.append(str(e)[-3000:])
                dmh.log(f"  retrying churn {frac:.0%} (attempt {attempt + 2}): "
                        + next(t for t in dmh.TRANSIENT if t in str(e)))
        row["failed_attempts"] = failures
        out["fractions"][str(frac)] = row
    out["seconds"] = time.time() - t_start
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
    ap.add_argument("--data-dir", default=None,
                    help="where the synthetic sets are kept or made (default: WORK, which each run empties)")
    ap.add_argument("--work", default=str(dmh.ROOT / "runs" / "churn"))
    ap.add_argument("--out", default=None, help="results file (default: results.json here; with --quick WORK/results.json); "
                    "the parts not run keep their results from it")
    ap.add_argument("--modes", default="shine,dhnsw", help="the parts to run: shine (with hnswlib), dhnsw or both")
    ap.add_argument("--dhnsw-partitions", type=int, default=16, help="d-HNSW partitions (default %(default)s)")
    ap.add_argument("--dhnsw-probe", default="4,8",
                    help="d-HNSW partitions searched per query, a comma list: each query point at each (default "
                         "%(default)s; the first is the main one)")
    ap.add_argument("--dhnsw-batch", type=int, default=500, help="d-HNSW queries per batch (default %(default)s)")
    ap.add_argument("--dhnsw-rebuilds", type=int, default=5,
                    help="d-HNSW rebuilds of the churned live set, each queried (default %(default)s)")
    ap.add_argument("--shine-consolidate", action="store_true",
                    help="shine: run `consolidate` after each delete, before the inserts reuse the records")
    ap.add_argument("--shine-alpha", type=float, default=1.0, help="consolidate --alpha (default %(default)s)")
    ap.add_argument("--shine-upper-ef", type=int, default=1,
                    help="also query shine with this --upper-ef (recall and READs beside the greedy descent's)")
    ap.add_argument("--skip-hnswlib", action="store_true", help="leave hnswlib's part out")
    ap.add_argument("--quick", action="store_true", help="n0 4000, 200 queries, 2 rounds (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.n0, a.queries, a.rounds = 4000, 200, 2
    modes = [m for m in a.modes.split(",") if m]
    if not modes or set(modes) - {"shine", "dhnsw"}:
        raise SystemExit(f"--modes {a.modes}: shine, dhnsw or both")
    dmh.BIN = Path(a.bin).resolve()
    work = Path(a.work).resolve()
    out = Path(a.out) if a.out else (work / "results.json" if a.quick else HERE / "results.json")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fractions = [float(f) for f in a.fractions.split(",")]
    run = Run(a, work)
    if a.n0 + int(max(fractions) * a.n0) > run.x.shape[0]:
        raise SystemExit(f"--n0 {a.n0}: the set has {run.x.shape[0]} rows, too few for the largest fraction")
    initial = {i: i for i in range(a.n0)}
    try:  # merge: the parts not run now keep what the file holds
        res = json.loads(out.read_text())
    except (OSError, ValueError):
        res = {}
    if "shine" in modes:
        keep = {"dhnsw": res["dhnsw"]} if "dhnsw" in res else {}
        res = shine_part(run, a, work, fractions, initial)
        res.update(keep)
    if "dhnsw" in modes:
        res["dhnsw"] = dhnsw_part(run, fractions, initial, 11)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    dmh.log(f"wrote {out}")


if __name__ == "__main__":
    main()
