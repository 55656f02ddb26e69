#!/usr/bin/env bash
# Inside a soft-RoCE guest (tools/rxe-vm.sh): ROUNDS rounds of fabric-bench and perftest on the
# same rxe device, alternating, so that both see the same (noisy, emulated) machine.
# Usage: guest_rounds.sh BIN_DIR OUT_DIR ROUNDS ITERS
set -uo pipefail
B=$1 W=$2 ROUNDS=$3 ITERS=$4
IP=${RXE_VM_IP:-10.77.0.1}
DEV=${RXE_VM_DEV:-rxe0}
"$B/memnode" --provider verbs --listen "$IP:0" --region 128MiB --ready-file "$W/memnode.ready" >"$W/memnode.log" 2>&1 &
MP=$!
trap 'kill -TERM $MP 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 600); do [[ -s $W/memnode.ready ]] && break; sleep 0.05; done
MN=$(cat "$W/memnode.ready")
perf() {  # perftest server in the background, client against it; the result row only
  local tool=$1 out=$2
  shift 2
  "$tool" -d "$DEV" "$@" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  "$tool" -d "$DEV" "$@" "$IP" 2>&1 | grep -A1 '#bytes' | tail -1 >"$out"
  wait "$server"
}
for r in $(seq "$ROUNDS"); do
  "$B/fabric-bench" --provider verbs --memnodes "$MN" --seconds 0.3 --max-size 4KiB --iters "$ITERS" \
    --json "$W/fabric-bench-$r.json" >"$W/fabric-bench-$r.txt" 2>&1 || { cat "$W/fabric-bench-$r.txt"; exit 1; }
  perf ib_read_lat "$W/ib_read_lat-$r.txt" -s 512 -n "$ITERS"
  perf ib_atomic_lat "$W/ib_atomic_lat-fadd-$r.txt" -A FETCH_AND_ADD -n "$ITERS"
  perf ib_atomic_lat "$W/ib_atomic_lat-cas-$r.txt" -A CMP_AND_SWAP -n "$ITERS"
  echo "round $r done"
done
