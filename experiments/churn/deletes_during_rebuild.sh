#!/bin/bash
# Deletes while a d-HNSW rebuild runs (experiments/churn/README.md): wordnet's 50,000 rows in
# 16 partitions over 2 memnodes on shm; 5 % deleted with the index idle, then a rebuild, and
# 1 s into it 5 % more. Prints both delete reports' rates and waits and the rebuild's report.
# BIN: the binaries (default build/bin of this checkout), WORK: a scratch directory.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
B=${BIN:-$here/build/bin}; D=${DATA:-$here/../shared/data/wordnet-minilm-384}; W=${WORK:-/tmp/deletes-during-rebuild}
rm -rf "$W"; mkdir -p "$W"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in 0 1; do
  "$B/memnode" --listen 127.0.0.1:0 --id $i --provider shm --region 2GiB --ready-file "$W/m$i.ready" > "$W/m$i.log" 2>&1 &
  pids+=($!)
done
while [ ! -s "$W/m0.ready" ] || [ ! -s "$W/m1.ready" ]; do sleep 0.2; done
CN=("$B/computenode" --mode dhnsw --provider shm --memnodes "$(cat "$W/m0.ready"),$(cat "$W/m1.ready")")
"${CN[@]}" --cn-id 0 --num-cns 1 build --data "$D/base.fvecs" --partitions 16 > "$W/build.log" 2>&1
/usr/bin/python3 - "$D/base.fvecs" "$W" <<'PY'
import os, random, sys
n = os.path.getsize(sys.argv[1]) // (4 + 4 * 384)
ids = random.Random(1).sample(range(n), n // 10)
for name, part in (("del_idle", ids[: len(ids) // 2]), ("del_rebuild", ids[len(ids) // 2 :])):
    open(os.path.join(sys.argv[2], name + ".txt"), "w").write("\n".join(map(str, part)) + "\n")
PY
"${CN[@]}" --cn-id 0 --num-cns 1 delete --ids "$W/del_idle.txt" --report "$W/del_idle.json" > "$W/del_idle.log" 2>&1
"${CN[@]}" --cn-id 1 --num-cns 2 rebuild --report "$W/rebuild.json" > "$W/rebuild.log" 2>&1 &
rb=$!
sleep 1
"${CN[@]}" --cn-id 0 --num-cns 1 delete --ids "$W/del_rebuild.txt" --report "$W/del_rebuild.json" > "$W/del_rebuild.log" 2>&1
wait $rb
/usr/bin/python3 - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
for f in ("del_idle", "del_rebuild"):
    r = json.load(open(os.path.join(w, f + ".json")))
    print(f"{f}: {r['deleted']} deleted in {r['seconds']:.3f} s ({r['deletes_per_s']:,.0f}/s), "
          f"rebuild_waits {r['insert']['rebuild_waits']}, not found {r['not_found']}")
r = json.load(open(os.path.join(w, "rebuild.json.cn1")))
print("rebuild:", {k: r.get(k) for k in ("vectors", "deleted_dropped", "deletes_carried", "seconds", "seconds_total")})
PY
