#!/usr/bin/env bash
# dmhnsw demo: installs dependencies if missing, builds, prepares data, starts memnodes and a
# computenode on this host, runs a workload, and prints the report.
#
# At this stage the demo exercises the foundation: the transport against live memnodes
# (computenode selftest and fabric-bench), and the data tools on the real SIFT data in
# ../shared/data (a skewed query workload from it). Later stages grow it into index builds
# and query reports.
#
#   tools/demo.sh [--provider shm|tcp]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PROVIDER=shm
while [[ $# -gt 0 ]]; do
  case $1 in
    --provider) PROVIDER=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
BIN=$ROOT/build/bin

RUN=$ROOT/runs/demo-$(date +%Y%m%d-%H%M%S)
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
    --dist zipf:0.99 --count 10000 --warmup 1000 --seed 7 --out "$RUN/sift-zipf.wl"
else
  echo "(../shared/data not found: generating a synthetic set instead)"
  "$BIN/datagen" --n 10000 --d 128 --clusters 32 --spread 0.3 --seed 1 --queries 200 \
    --out-base "$RUN/base.fvecs" --out-queries "$RUN/queries.fvecs"
  "$BIN/groundtruth" --base "$RUN/base.fvecs" --queries "$RUN/queries.fvecs" --k 100 --metric l2 --out "$RUN/gt.ivecs"
  "$BIN/workload" --queries "$RUN/queries.fvecs" --groundtruth "$RUN/gt.ivecs" \
    --dist zipf:0.99 --count 10000 --warmup 1000 --seed 7 --out "$RUN/synthetic-zipf.wl"
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
"$BIN/fabric-bench" --provider "$PROVIDER" --memnodes "$MEMNODES" --seconds 0.3 --json "$RUN/fabric-bench.json"

echo
echo "Report and logs: $RUN"
