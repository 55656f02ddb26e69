#!/usr/bin/env bash
# dmhnsw demo: installs dependencies if missing, builds, prepares data, starts memnodes and a
# computenode on this host, runs a workload, and prints the report.
#
# It starts 2 memnodes, checks the transport (computenode selftest, fabric-bench), builds a
# shine index (one global HNSW graph spread over both memnodes) on the real SIFT data in
# ../shared/data with 2 computenodes, runs a Zipf-skewed query workload against it on 3
# computenodes with node caches, without and with adaptive routing, prints both query reports
# and the cache segmentation penalty (csp-report), and hnswlib's numbers on the same data; then
# builds a dhnsw index of the same data (8 balanced partitions, a sub-HNSW each, over 2 new
# memnodes serving the images), runs the same workload on 2 computenodes and prints both
# modes side by side.
#
#   tools/demo.sh [--provider cxl|shm|tcp]   (cxl: the regions mapped, as a shared memory device)
#                 [--bin DIR]   use the binaries in DIR as they are (no install, no build)
#                 [--out DIR]   reports and logs here (default runs/demo-<time>)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PROVIDER=cxl
BIN=""
RUN=$ROOT/runs/demo-$(date +%Y%m%d-%H%M%S)
while [[ $# -gt 0 ]]; do
  case $1 in
    --provider) PROVIDER=$2; shift 2 ;;
    --bin) BIN=$(cd "$2" && pwd); shift 2 ;;
    --out) RUN=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z $BIN ]]; then
  tools/install-deps.sh
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)"
  BIN=$ROOT/build/bin
fi

mkdir -p "$RUN"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

echo
echo "== 1. data: a Zipf-skewed query workload from the real SIFT queries (bigann10k)"
DATA=$ROOT/../shared/data/bigann10k
if [[ -f $DATA/bigann10k_query.fvecs ]]; then
  "$BIN/workload" --queries "$DATA/bigann10k_query.fvecs" --groundtruth "$DATA/bigann10k_groundtruth.ivecs" \
    --dist zipf:0.99 --count 2000 --warmup 200 --seed 7 --out "$RUN/sift-zipf.wl"
else
  echo "(../shared/data not found: generating a synthetic set instead)"
  "$BIN/datagen" --n 10000 --d 128 --clusters 32 --spread 0.3 --seed 1 --queries 200 \
    --out-base "$RUN/base.fvecs" --out-queries "$RUN/queries.fvecs"
  "$BIN/groundtruth" --base "$RUN/base.fvecs" --queries "$RUN/queries.fvecs" --k 100 --metric l2 --out "$RUN/gt.ivecs"
  "$BIN/workload" --queries "$RUN/queries.fvecs" --groundtruth "$RUN/gt.ivecs" \
    --dist zipf:0.99 --count 2000 --warmup 200 --seed 7 --out "$RUN/synthetic-zipf.wl"
fi

echo
echo "== 2. two memnodes over --provider $PROVIDER"
MEMNODES=""
for id in 0 1; do
  "$BIN/memnode" --id $id --provider "$PROVIDER" --listen 127.0.0.1:0 --region 512MiB \
    --ready-file "$RUN/memnode$id.addr" >"$RUN/memnode$id.log" 2>&1 &
  PIDS+=($!)
done
for id in 0 1; do
  for _ in $(seq 200); do [[ -s $RUN/memnode$id.addr ]] && break; kill -0 "${PIDS[$id]}" 2>/dev/null || { cat "$RUN/memnode$id.log"; exit 1; }; sleep 0.05; done
  [[ -s $RUN/memnode$id.addr ]] || { echo "memnode $id did not come up:"; cat "$RUN/memnode$id.log"; exit 1; }
  MEMNODES+="${MEMNODES:+,}$(cat "$RUN/memnode$id.addr")"
done
echo "memnodes: $MEMNODES"

echo
echo "== 3. computenode selftest against both memnodes"
"$BIN/computenode" --provider "$PROVIDER" --memnodes "$MEMNODES" selftest --atomics 2000

echo
echo "== 4. fabric-bench against memnode 0"
"$BIN/fabric-bench" --provider "$PROVIDER" --memnodes "$MEMNODES" --seconds 0.2 --max-size 1MiB \
  --json "$RUN/fabric-bench.json"

if [[ -f $DATA/bigann10k_base.bvecs ]]; then
  BASE=$DATA/bigann10k_base.bvecs; WL=$RUN/sift-zipf.wl
else
  BASE=$RUN/base.fvecs; WL=$RUN/synthetic-zipf.wl
fi
echo
echo "== 5. shine build: 2 computenodes x 2 threads insert $(basename "$BASE") into one graph over both memnodes"
CN=("$BIN/computenode" --mode shine --provider "$PROVIDER" --memnodes "$MEMNODES" --num-cns 2)
"${CN[@]}" --cn-id 1 build --data "$BASE" --threads 2 --coroutines 2 >"$RUN/build-cn1.log" 2>&1 &
CN1=$!
"${CN[@]}" --cn-id 0 build --data "$BASE" --threads 2 --coroutines 2 --report "$RUN/build.json"
wait $CN1 || { echo "computenode 1 failed:"; cat "$RUN/build-cn1.log"; exit 1; }

echo
echo "== 6. shine query with node caches: 3 computenodes, 5% cache each, without and with adaptive routing"
# Runs the workload on 3 computenodes with the given extra flags; computenode 0 writes $1.
query3() {
  local report=$1; shift
  local pids=()
  for cn in 1 2; do
    "$BIN/computenode" --mode shine --provider "$PROVIDER" --memnodes "$MEMNODES" --num-cns 3 --cn-id $cn \
      query --workload "$WL" --k 10 --ef-search 32 --threads 1 --coroutines 4 "$@" >"$RUN/query-cn$cn.log" 2>&1 &
    pids+=($!)
  done
  "$BIN/computenode" --mode shine --provider "$PROVIDER" --memnodes "$MEMNODES" --num-cns 3 --cn-id 0 \
    query --workload "$WL" --k 10 --ef-search 32 --threads 1 --coroutines 4 "$@" --report "$report"
  for i in 0 1; do wait "${pids[$i]}" || { echo "computenode $((i + 1)) failed:"; cat "$RUN/query-cn$((i + 1)).log"; exit 1; }; done
}
echo "-- routing none (every computenode answers its own share)"
query3 "$RUN/query-none.json" --cache-ratio 0.05 --routing none --trace "$RUN/trace-none"
echo "-- routing adaptive (queries go to the computenode whose partition fits, through the memnodes)"
query3 "$RUN/query-adaptive.json" --cache-ratio 0.05 --routing adaptive --route-batch 200 --trace "$RUN/trace-adaptive"

echo
echo "== 6b. cache segmentation penalty: each run's accesses replayed into one cache of the summed size"
"$BIN/csp-report" "$RUN/trace-none" "$RUN/trace-adaptive" --json "$RUN/csp.json"
rm -rf "$RUN/trace-none" "$RUN/trace-adaptive"

echo "== 7. the same workload on single-machine hnswlib (same M, efConstruction, efSearch)"
"$BIN/hnswlib-bench" --base "$BASE" --workload "$WL" --m 16 --ef-construction 200 --ef-search 16,32,64 --k 10 \
  --threads 2 --json "$RUN/hnswlib.json"

echo
echo "== 8. dhnsw: the same data split into 8 balanced partitions, one sub-HNSW each, over 2 memnodes"
"$BIN/dhnsw-build" --data "$BASE" --partitions 8 --m 16 --ef-construction 200 --memnodes 2 \
  --out "$RUN/dhnsw.img" --json "$RUN/dhnsw-build.json"
DMEMNODES=""
for id in 0 1; do
  "$BIN/memnode" --id $id --provider "$PROVIDER" --listen 127.0.0.1:0 --load "$RUN/dhnsw.img.$id" \
    --ready-file "$RUN/dhnsw-memnode$id.addr" >"$RUN/dhnsw-memnode$id.log" 2>&1 &
  PIDS+=($!)
done
for id in 0 1; do
  for _ in $(seq 200); do [[ -s $RUN/dhnsw-memnode$id.addr ]] && break; sleep 0.1; done
  [[ -s $RUN/dhnsw-memnode$id.addr ]] || { echo "memnode $id did not start:"; cat "$RUN/dhnsw-memnode$id.log"; exit 1; }
  DMEMNODES+="${DMEMNODES:+,}$(cat "$RUN/dhnsw-memnode$id.addr")"
done
echo "-- 2 computenodes, batches of 500 queries, each query searches its 3 nearest partitions"
"$BIN/computenode" --mode dhnsw --provider "$PROVIDER" --memnodes "$DMEMNODES" --num-cns 2 --cn-id 1 \
  query --workload "$WL" --k 10 --ef-search 32 --batch 500 --probe 3 >"$RUN/dhnsw-query-cn1.log" 2>&1 &
DCN1=$!
"$BIN/computenode" --mode dhnsw --provider "$PROVIDER" --memnodes "$DMEMNODES" --num-cns 2 --cn-id 0 \
  query --workload "$WL" --k 10 --ef-search 32 --batch 500 --probe 3 --report "$RUN/dhnsw-query.json"
wait $DCN1 || { echo "computenode 1 failed:"; cat "$RUN/dhnsw-query-cn1.log"; exit 1; }

echo
echo "== 9. both modes side by side (same data, same workload, efSearch 32)"
/usr/bin/python3 - "$RUN/query-none.json" "$RUN/query-adaptive.json" "$RUN/dhnsw-query.json" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    r = json.load(open(path))
    run = r["runs"][0]
    if r["mode"] == "shine":
        what = f"shine, 3 cns, 5% node cache, routing {r['routing']}"
        extra = f"CHR {run.get('cache_hit_rate', 0):.2f}"
    else:
        s = r["settings"]
        what = f"dhnsw, {r['num_cns']} cns, {r['index']['partitions']} partitions, probe {s['probe']}"
        extra = f"{run['batches']['fetched']:.1f} sub-HNSWs fetched/batch"
    rows.append((what, run["recall"], run["qps"], run["latency_us"]["p50"], run["per_query"]["bytes"] / 1024, extra))
print(f"{'run':48} {'recall@10':>9} {'QPS':>8} {'p50 us':>9} {'KiB/query':>10}  notes")
for w, rec, qps, p50, kib, extra in rows:
    print(f"{w:48} {rec:9.4f} {qps:8.0f} {p50:9.1f} {kib:10.1f}  {extra}")
print("(shine latency: per query; dhnsw latency: per query amortised over its batch)")
PY

echo
echo "Report and logs: $RUN"
