#!/usr/bin/env bash
# Runs inside a soft-RoCE guest (tools/rxe-vm.sh): one scenario of tests/rxe/test_rxe.cpp over
# --provider verbs. Prints what the test checks; logs and reports go to DIR (shared with the
# host). Usage: guest.sh CASE BIN_DIR DIR [ARGS...]
set -uo pipefail
CASE=$1 B=$2 W=$3
shift 3
IP=${RXE_VM_IP:-10.77.0.1}
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null' EXIT

# start_memnode ID [memnode flags...]: starts it on this guest's rxe address; sets MN (HOST:PORT).
start_memnode() {
  local id=$1 tag=${TAG:-$1}
  shift
  rm -f "$W/memnode$tag.ready"
  "$B/memnode" --provider verbs --id "$id" --listen "$IP:0" --region 128MiB --ready-file "$W/memnode$tag.ready" \
    "$@" >"$W/memnode$tag.log" 2>&1 &
  PIDS+=($!)
  MNPID=$!
  for _ in $(seq 600); do
    [[ -s $W/memnode$tag.ready ]] && break
    kill -0 "$MNPID" 2>/dev/null || { echo "memnode $id exited at start:"; cat "$W/memnode$tag.log"; exit 1; }
    sleep 0.05
  done
  [[ -s $W/memnode$tag.ready ]] || { echo "memnode $id not ready in 30 s:"; cat "$W/memnode$tag.log"; exit 1; }
  MN=$(cat "$W/memnode$tag.ready")
}

# perftest beside us on the same device: a server in the background, the client against it.
perftest() {
  local tool=$1
  shift
  "$tool" -d "${RXE_VM_DEV:-rxe0}" "$@" >"$W/$tool-server.log" 2>&1 &
  sleep 1
  "$tool" -d "${RXE_VM_DEV:-rxe0}" "$@" "$IP" 2>&1 | grep -A1 '#bytes' | tail -1 | sed "s/^/$tool: /"
}

case $CASE in
  selftest-bench)
    # The transport's checks, then fabric-bench's latency and doorbell columns and the
    # memnode's CPU, then perftest on the same rxe device.
    start_memnode 0
    "$B/computenode" --provider verbs --memnodes "$MN" selftest --atomics 500 || exit 1
    # An outsider that never passed the control port's check asks the rdma_cm port for a queue pair.
    CM_PORT=$(grep -o 'rdma_cm on [0-9.]*:[0-9]*' "$W/memnode0.log" | head -1 | sed 's/.*://')
    timeout 20 rping -c -a "$IP" -p "$CM_PORT" -C 1 >"$W/rping.log" 2>&1
    echo "outsider rping exit $?"
    grep "refused a queue pair" "$W/memnode0.log"
    "$B/fabric-bench" --provider verbs --memnodes "$MN" --seconds 0.15 --max-size 4KiB --iters 2000 \
      --json "$W/fabric-bench.json" || exit 1
    perftest ib_read_lat -s 512 -n 2000
    perftest ib_atomic_lat -n 2000
    # Then a memnode killed under a computenode's reads: the computenode fails naming it, fast.
    TAG=k start_memnode 0
    "$B/computenode" --provider verbs --memnodes "$MN" selftest --atomics 10 --loop 60 >"$W/cn.log" 2>&1 &
    CNPID=$!
    for _ in $(seq 600); do grep -q "selftest\|all checks" "$W/cn.log" && break; sleep 0.05; done
    sleep 1
    kill -KILL "$MNPID"
    t0=$(date +%s.%N)
    wait "$CNPID"
    rc=$?
    t1=$(date +%s.%N)
    cat "$W/cn.log"
    echo "computenode exit $rc after $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
    ;;
  shine-dhnsw)
    # A small shine build and query over two memnodes, then d-HNSW images built on the host
    # ($3, its workload $4) served by two more and queried; the host compares recall with shm.
    # Then lock hand-over under contention (docs/architecture.md, "Words that atomics touch"):
    # the release by COMPARE_SWAP holds (hammer $5 rounds); the plain-WRITE release is lost to a
    # waiter's failed COMPARE_SWAP (within $6 s; the hammer stops at the first loss, which is a
    # race: one word and 16 coroutines a thread keep more COMPARE_SWAPs in flight against each
    # release: lost within 3-6 s, where 2 words and 8 coroutines took up to 32 s under TCG). One
    # guest for all: a boot costs seconds of the suite. (The node locks of shine builds under contention are tested over shm, tcp and cxl.)
    start_memnode 0; M0=$MN
    start_memnode 1; M1=$MN
    CN=("$B/computenode" --mode shine --provider verbs --memnodes "$M0,$M1" --cn-id 0 --num-cns 1)
    "${CN[@]}" build --data "$1" --id-capacity 0 --m 12 --ef-construction 80 --threads 1 --report "$W/build.json" || exit 1
    "${CN[@]}" query --workload "$2" --k 10 --ef-search 32 --threads 1 --coroutines 2 --report "$W/query.json" || exit 1
    TAG=d0 start_memnode 0 --load "$3.0"; D0=$MN
    TAG=d1 start_memnode 1 --load "$3.1"; D1=$MN
    "$B/computenode" --mode dhnsw --provider verbs --memnodes "$D0,$D1" --cn-id 0 --num-cns 1 \
      query --workload "$4" --k 10 --ef-search 32 --threads 1 --report "$W/dhnsw-query.json" || exit 1
    TAG=l0 start_memnode 0; L0=$MN
    "$B/computenode" --provider verbs --memnodes "$L0" selftest --atomics 10 --lock-hammer "$5" --lock-words 2 \
      --lock-threads 2 --lock-coroutines 4 --lock-release cas
    echo "hammer cas exit $?"
    "$B/computenode" --provider verbs --memnodes "$L0" selftest --atomics 10 --lock-hammer "$6" --lock-words 1 \
      --lock-threads 2 --lock-coroutines 16 --lock-release write
    echo "hammer write exit $?"
    ;;
  replicas)
    # Replica sets over verbs: 2 memnodes x 2 copies, a shine build, then queries through the
    # SIGKILL of memnode 1's first copy (docs/replication.md).
    R=(--replicas 2)
    TAG=0c0 start_memnode 0 "${R[@]}" --copy 0; A0=$MN
    TAG=0c1 start_memnode 0 "${R[@]}" --copy 1; A1=$MN
    TAG=1c0 start_memnode 1 "${R[@]}" --copy 0; B0=$MN; KILL=$MNPID
    TAG=1c1 start_memnode 1 "${R[@]}" --copy 1; B1=$MN
    CN=("$B/computenode" --mode shine --provider verbs --memnodes "$A0,$A1,$B0,$B1" --cn-id 0 --num-cns 1)
    "${CN[@]}" build --data "$1" --id-capacity 0 --m 12 --ef-construction 80 --threads 1 --report "$W/build.json" || exit 1
    "${CN[@]}" query --workload "$2" --k 10 --ef-search 32 --threads 1 --coroutines 2 --cache-ratio 0 \
      --repeat-seconds 4 --report "$W/query.json" >"$W/query.log" 2>&1 &
    QPID=$!
    # The kill lands while it queries (a loaded host can take seconds to start it).
    for _ in $(seq 600); do grep -q "connected to" "$W/query.log" && break; sleep 0.05; done
    sleep 2
    kill -KILL "$KILL"
    wait "$QPID"
    echo "query exit $?"
    cat "$W/query.log"
    # A computenode that joins with that copy already dead goes on with its set's other copy.
    "${CN[@]}" query --workload "$2" --k 10 --ef-search 32 --threads 1 --coroutines 2 --cache-ratio 0 \
      --report "$W/query2.json" >"$W/query2.log" 2>&1
    echo "query2 exit $?"
    cat "$W/query2.log"
    ;;
  readme)
    # README.md's RDMA blocks, extracted on the host (tests/docs/readme_blocks.py --extract rdma
    # --set NETDEV=... --set MY_IP=...) into $1, run as a user runs them. They make soft-RoCE
    # themselves (modprobe rdma_rxe; rdma link add rxe0 ...), so the rxe0 that rxe-vm.sh made goes
    # first; the script lays out its work directory (build/bin -> BIN_DIR) and runs there.
    rdma link delete "${RXE_VM_DEV:-rxe0}" || exit 1
    RW=$(mktemp -d /tmp/readme-rdma.XXXXXX)
    bash "$1" "$RW"
    rc=$?
    echo "README rdma blocks exit $rc"
    exit $rc
    ;;
  pair-memnode)
    # Guest A of --pair: a memnode on its NIC's address, reachable from guest B with the token.
    start_memnode 0
    echo "$MN" >"$W/pair.addr.tmp" && mv "$W/pair.addr.tmp" "$W/pair.addr"
    for _ in $(seq 1200); do [[ -e $W/pair.done ]] && break; sleep 0.1; done
    ;;
  pair-computenode)
    # Guest B of --pair: waits for A's memnode, runs the selftest across the two guests.
    for _ in $(seq 1200); do [[ -s $W/pair.addr ]] && break; sleep 0.1; done
    "$B/computenode" --provider verbs --memnodes "$(cat "$W/pair.addr")" selftest --atomics 20
    rc=$?
    touch "$W/pair.done"
    exit $rc
    ;;
  *)
    echo "guest.sh: unknown case $CASE" >&2
    exit 2
    ;;
esac
