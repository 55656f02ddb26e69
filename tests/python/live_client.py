"""The Python client against live `computenode serve` endpoints (run by test_client_live.py).

Runs inside the virtualenv the driver created, with the `dmhnsw` package installed from
python/. Usage:

    live_client.py --token TOKEN --queries Q.fvecs --groundtruth GT.ivecs --readme README.md \
        MODE=HOST:PORT ...

For every endpoint: the example of python/README.md, run as written there (context manager,
health, info, search; the token from $DMHNSW_TOKEN),
recall@10 of every query in batches of 100 against the exact ground truth, info() fields, every
malformed request refused with InvalidArgument naming its field (by the client, or by the server:
also requests the client would refuse, sent raw through its stub), a wrong or missing token refused
with Unauthenticated, and a good search answered after all of that. Exit 0 when all pass; else
a message per failed check and exit 1.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import numpy as np

import dmhnsw
from dmhnsw._proto import dmhnsw_pb2

MIN_RECALL = 0.95
BATCH = 100
K = 10

failures: list[str] = []


def check(cond: bool, what: str) -> bool:
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)
    return cond


def read_vecs(path: str, dtype: str) -> np.ndarray:
    """An fvecs/ivecs file (each row: int32 d, then d values of 4 bytes) as an n x d array."""
    raw = np.fromfile(path, dtype="<i4")
    if raw.size == 0:
        raise SystemExit(f"{path}: empty")
    dim = int(raw[0])
    if dim <= 0 or raw.size % (dim + 1) != 0:
        raise SystemExit(f"{path}: not a *vecs file of dimension {dim}")
    rows = raw.reshape(-1, dim + 1)
    if not (rows[:, 0] == dim).all():
        raise SystemExit(f"{path}: rows of different dimensions")
    return rows[:, 1:].copy().view(dtype)


README_ADDRESS = "127.0.0.1:7700"


def readme_example_code(readme: str) -> str:
    """The first ```python block under "## Example" in python/README.md."""
    text = open(readme, encoding="utf-8").read()
    m = re.search(r"^## Example\n.*?^```python\n(.*?)^```", text, re.M | re.S)
    if not m:
        raise SystemExit(f"{readme}: no ```python block under '## Example'")
    code = m.group(1)
    if README_ADDRESS not in code:
        raise SystemExit(f"{readme}: the example does not connect to {README_ADDRESS}")
    return code


def readme_example(code: str, target: str) -> None:
    """Runs the README's example as written there, but for the address (token: $DMHNSW_TOKEN)."""
    ns: dict = {"__name__": "__readme_example__"}
    print("  README example output:", flush=True)
    try:
        exec(compile(code.replace(README_ADDRESS, target), "python/README.md (## Example)", "exec"), ns)
    except SystemExit as e:
        check(False, f"README example: SystemExit({e})")
        return
    except Exception as e:  # noqa: BLE001 - report what the README's code raised
        check(False, f"README example: {type(e).__name__}: {e}")
        return
    ids, distances, client = ns.get("ids"), ns.get("distances"), ns.get("client")
    check(isinstance(ids, np.ndarray) and ids.shape == (8, 10) and ids.dtype == np.int64,
          f"README example: ids {getattr(ids, 'shape', ids)} {getattr(ids, 'dtype', '')}")
    check(isinstance(distances, np.ndarray) and distances.shape == (8, 10) and distances.dtype == np.float32,
          f"README example: distances {getattr(distances, 'shape', distances)} {getattr(distances, 'dtype', '')}")
    check(isinstance(ids, np.ndarray) and bool((ids >= 0).all()), "README example: some of the 8 x 10 ids are -1")
    # the with block closed the client: a call now raises ValueError, as the README says
    try:
        client.info()
        check(False, "README example: a call on the closed client did not raise")
    except ValueError:
        pass


def recall_at_k(ids: np.ndarray, gt: np.ndarray) -> float:
    hits = sum(len(set(ids[i].tolist()) & set(gt[i, :K].tolist())) for i in range(len(ids)))
    return hits / (K * len(ids))


def expect_invalid(what: str, field: str, fn) -> None:
    try:
        fn()
    except dmhnsw.InvalidArgument as e:
        msg = str(e)
        check(re.match(rf"{re.escape(field)}\b", msg) is not None,
              f"{what}: InvalidArgument {msg!r} does not name the field {field!r}")
        check(isinstance(e, ValueError), f"{what}: InvalidArgument is not a ValueError")
        print(f"  {what}: InvalidArgument {msg!r}")
        return
    except Exception as e:  # noqa: BLE001 - report whatever came instead
        check(False, f"{what}: expected InvalidArgument naming {field!r}, got {type(e).__name__}: {e}")
        return
    check(False, f"{what}: expected InvalidArgument naming {field!r}, the search succeeded")


def check_deletes(mode: str, client, new: np.ndarray, new_ids: np.ndarray, count: int) -> None:
    """Sparse 63-bit ids, upserts and deletes of the 16 vectors just inserted (both modes)."""
    info = client.info()
    check(info.ids, f"{mode}: info().ids is not set ")
    # any ids: sparse, non-monotone, up to 2**63 - 1
    wide = np.array([2**63 - 1, 3_000_000_007, 2**40 + 5], dtype=np.int64)
    far = new[:3] + 50.0
    check(client.insert(far, wide) == 3, f"{mode}: insert of 63-bit ids")
    found, _ = client.search(far, k=1)
    check(bool((found[:, 0] == wide).all()), f"{mode}: 63-bit ids not found: {found[:, 0]}")
    expect_invalid("insert: an id the index holds", "ids", lambda: client.insert(far[:1], wide[:1]))
    # upsert 4 of the 16: new vectors under the same ids; the old vectors no longer answer
    moved = new[:4] + 20.0
    check(client.upsert(moved, new_ids[:4]) == 4, f"{mode}: upsert did not replace 4")
    found, dist = client.search(moved, k=1)
    check(bool((found[:, 0] == new_ids[:4]).all()) and bool((dist[:, 0] < 1e-3).all()),
          f"{mode}: upserted vectors not found: {found[:, 0]} {dist[:, 0]}")
    found, dist = client.search(new[:4], k=5)
    stale = [(i, int(found[i, j])) for i in range(4) for j in range(5)
             if int(found[i, j]) in set(new_ids[:4].tolist()) and dist[i, j] < 1.0]
    check(not stale, f"{mode}: an upserted id answers with its old vector: {stale}")
    # delete 4 others and an id never inserted: that one comes back, the rest are gone
    missing = client.delete(np.concatenate([new_ids[4:8], [123_456_789_012]]))
    check(missing.tolist() == [123_456_789_012], f"{mode}: delete reported missing {missing.tolist()}")
    found, _ = client.search(new[4:8], k=10)
    gone = set(new_ids[4:8].tolist())
    check(not (set(found.ravel().tolist()) & gone), f"{mode}: a deleted id was returned")
    check(client.delete(new_ids[4:5]).tolist() == [int(new_ids[4])], f"{mode}: a second delete found the id")
    expect_invalid("delete: an id twice", "ids", lambda: client.delete([7, 7]))
    expect_invalid("delete: a negative id", "ids", lambda: client.delete([-3]))
    after = client.info()
    check(after.count == count + 3 - 4, f"{mode}: info().count {after.count}, want {count + 3 - 4}")
    # 8 records deleted (4 upserted, 4 deleted); inserts may have reused some of them since
    check(info.deleted <= after.deleted + 7 and after.deleted <= info.deleted + 8,
          f"{mode}: info().deleted went from {info.deleted} to {after.deleted}")
    check(client.delete(wide).size == 0, f"{mode}: deleting the 63-bit ids")
    print(f"  {mode}: 63-bit ids inserted, 4 upserted, 4 deleted; no stale or deleted answer")


def run_endpoint(mode: str, target: str, token: str, queries: np.ndarray, gt: np.ndarray, example: str) -> dict:
    print(f"[{mode}] {target}", flush=True)
    readme_example(example, target)  # token from $DMHNSW_TOKEN, as the README says

    with dmhnsw.Client(target, token=token, timeout=60) as client:
        check(client.health() is True, f"{mode}: health() is not True")
        info = client.info()
        print(f"  info: {info}")
        check(info.mode == mode, f"{mode}: info().mode {info.mode!r}")
        check(info.dim == 128, f"{mode}: info().dim {info.dim}")
        check(info.metric == "l2", f"{mode}: info().metric {info.metric!r}")
        check(info.count >= 10000, f"{mode}: info().count {info.count} < 10000")
        check(info.memnodes == 2, f"{mode}: info().memnodes {info.memnodes}")
        check(info.provider == "tcp", f"{mode}: info().provider {info.provider!r}")
        check(info.max_k >= K, f"{mode}: info().max_k {info.max_k} < {K}")

        # recall@10 of every query, in batches of 100
        n = len(queries)
        all_ids = np.empty((n, K), dtype=np.int64)
        for b in range(0, n, BATCH):
            ids, dists = client.search(queries[b:b + BATCH], k=K)
            m = len(queries[b:b + BATCH])
            check(ids.shape == (m, K) and dists.shape == (m, K), f"{mode}: result shapes {ids.shape} {dists.shape}")
            check(bool((np.diff(dists, axis=1) >= 0).all()), f"{mode}: distances do not ascend")
            all_ids[b:b + m] = ids
        recall = recall_at_k(all_ids, gt)
        print(f"  recall@{K}: {recall:.4f} over {n} queries")
        check(recall >= MIN_RECALL, f"{mode}: recall@{K} {recall:.4f} < {MIN_RECALL}")

        # throughput: a few more passes over the queries, in batches of 100
        passes = 5
        t0 = time.perf_counter()
        for _ in range(passes):
            for b in range(0, n, BATCH):
                client.search(queries[b:b + BATCH], k=K)
        elapsed = time.perf_counter() - t0
        qps = passes * n / elapsed
        print(f"  QPS: {qps:.0f} ({passes} x {n} queries in batches of {BATCH}, {elapsed:.2f} s)")

        # malformed requests: InvalidArgument naming the field, from the server or the client
        q = queries[:1]
        expect_invalid("wrong dimension (127 columns)", "dim", lambda: client.search(q[:, :127], k=K))
        expect_invalid("k=0", "k", lambda: client.search(q, k=0))
        expect_invalid(f"k=max_k+1 ({info.max_k + 1})", "k", lambda: client.search(q, k=info.max_k + 1))
        nan = q.copy()
        nan[0, 3] = np.nan
        expect_invalid("a NaN value", "vectors", lambda: client.search(nan, k=K))
        inf = q.copy()
        inf[0, 3] = np.inf
        expect_invalid("an infinite value", "vectors", lambda: client.search(inf, k=K))
        big = q.astype(np.float64)
        big[0, 3] = 1e300  # beyond float32: an infinity after the conversion
        expect_invalid("a float64 value beyond float32's range", "vectors", lambda: client.search(big, k=K))
        # what the client passes on unchecked (it does not know the server's limits)
        expect_invalid("ef=100001", "ef_search", lambda: client.search(q, k=K, ef=100001))
        check(info.codes == "none" and info.rerank == 0, f"{mode}: codes {info.codes!r}, rerank {info.rerank}")
        expect_invalid("rerank=20 (an index without codes)", "rerank", lambda: client.search(q, k=K, rerank=20))
        expect_invalid("rerank=1025 (beyond 1024)", "rerank", lambda: client.search(q, k=K, rerank=1025))
        expect_invalid(f"max_batch+1 ({info.max_batch + 1}) queries", "vectors",
                       lambda: client.search(np.zeros((info.max_batch + 1, info.dim), dtype=np.float32), k=K))
        if mode == "shine":
            expect_invalid("probe=1 (shine has no partitions)", "probe", lambda: client.search(q, k=K, probe=1))
        else:
            expect_invalid("probe=1000000 (beyond the partitions)", "probe",
                           lambda: client.search(q, k=K, probe=1000000))
        # what the client refuses before sending, sent raw through its stub: the server's own checks
        row = np.ascontiguousarray(q, dtype="<f4").tobytes()
        raw_cases = (
            ("raw k=0", "k", dict(vectors=row, dim=info.dim, k=0)),
            ("raw empty batch", "vectors", dict(vectors=b"", dim=info.dim, k=K)),
            ("raw ragged batch (one float short)", "vectors", dict(vectors=row[:-4], dim=info.dim, k=K)),
            ("raw dim=0", "dim", dict(vectors=row, dim=0, k=K)),
        )
        for what, field, fields in raw_cases:
            request = dmhnsw_pb2.SearchRequest(**fields)
            expect_invalid(what, field, lambda request=request: client._call(client._stub.Search, request, None))

        # the cluster token
        for bad_token in ("not-the-token", ""):
            with dmhnsw.Client(target, token=bad_token, timeout=30) as outsider:
                for call, fn in (("search", lambda: outsider.search(q, k=K)), ("info", outsider.info)):
                    label = f"{mode}: {call} with token {bad_token!r}"
                    try:
                        fn()
                        check(False, f"{label}: answered")
                    except dmhnsw.Unauthenticated as e:
                        check(isinstance(e, dmhnsw.DmhnswError), f"{label}: not a DmhnswError")
                    except Exception as e:  # noqa: BLE001
                        check(False, f"{label}: expected Unauthenticated, got {type(e).__name__}: {e}")
        print("  wrong/missing token: Unauthenticated")

        # still answering, and correctly
        ids, _ = client.search(queries, k=K)
        after = recall_at_k(ids, gt)
        check(after >= MIN_RECALL, f"{mode}: recall@{K} after the bad requests {after:.4f} < {MIN_RECALL}")
        check(int(ids[0, 0]) == int(gt[0, 0]), f"{mode}: nearest of query 0 after the bad requests {ids[0, 0]} != {gt[0, 0]}")
        check(client.health() is True, f"{mode}: health() after the bad requests is not True")

        # inserts: 16 new vectors (queries shifted apart) under new ids, each then its own
        # nearest neighbour; Info counts them; a repeated id in one request is refused
        count0 = client.info().count
        new = queries[:16].copy() + 7.0
        new[:, 0] += np.arange(16, dtype=np.float32) * 3.0
        new_ids = np.arange(5_000_000, 5_000_016, dtype=np.int64)
        expect_invalid("insert: an id twice", "ids",
                       lambda: client.insert(new[:2], np.array([5_000_100, 5_000_100], dtype=np.int64)))
        check(client.insert(new, new_ids) == 16, f"{mode}: insert did not report 16 inserted")
        found, dist = client.search(new, k=1)
        check(bool((found[:, 0] == new_ids).all()), f"{mode}: inserted vectors not found: {found[:, 0]}")
        check(bool((dist[:, 0] < 1e-3).all()), f"{mode}: inserted vectors at distance {dist[:, 0]}")
        check(client.info().count == count0 + 16, f"{mode}: info().count did not grow by 16")
        print("  insert: 16 vectors found again, count grew by 16")
        check_deletes(mode, client, new, new_ids, count0 + 16)
    return {"mode": mode, "recall": recall, "qps": qps}


def check_not_grpc(target: str, token: str) -> None:
    """A client pointed at a memnode's control port is told it is no `computenode serve`."""
    with dmhnsw.Client(target, token=token, timeout=10) as client:
        try:
            client.info()
        except dmhnsw.Unavailable as e:
            check("does not answer gRPC" in str(e) and "computenode serve" in str(e),
                  f"a memnode's port ({target}): the message names neither: {e}")
            print(f"a memnode's port: {e}", flush=True)
            return
        except dmhnsw.DmhnswError as e:
            check(False, f"a memnode's port ({target}): {type(e).__name__} ({e.code}), not Unavailable: {e}")
            return
    check(False, f"a memnode's port ({target}) answered Info")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--token", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--groundtruth", required=True)
    ap.add_argument("--readme", required=True, help="python/README.md: its example is run too")
    ap.add_argument("--not-grpc", help="HOST:PORT of a memnode: the client must say it is no serve")
    ap.add_argument("endpoints", nargs="+", help="MODE=HOST:PORT")
    a = ap.parse_args()
    if a.not_grpc:
        check_not_grpc(a.not_grpc, a.token)

    queries = read_vecs(a.queries, "<f4")
    gt = read_vecs(a.groundtruth, "<i4")
    if len(gt) != len(queries) or queries.shape[1] != 128:
        raise SystemExit(f"queries {queries.shape} and ground truth {gt.shape} do not match")
    example = readme_example_code(a.readme)
    print(f"dmhnsw {dmhnsw.__version__} from {dmhnsw.__file__}; {len(queries)} queries", flush=True)

    results = []
    for spec in a.endpoints:
        mode, _, target = spec.partition("=")
        try:
            results.append(run_endpoint(mode, target, a.token, queries, gt, example))
        except Exception as e:  # noqa: BLE001 - an unexpected error fails this endpoint, not the rest
            check(False, f"{mode}: {type(e).__name__}: {e}")

    print("summary:")
    for r in results:
        print(f"  {r['mode']:6s} recall@{K} {r['recall']:.4f}  QPS {r['qps']:.0f}")
    if failures:
        print(f"{len(failures)} check(s) failed:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("all client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
