#!/usr/bin/env bash
# Fuzzes every parser of outside bytes with libFuzzer (tests/fuzz/README.md says what each
# harness covers):
#
#   tools/fuzz.sh SECONDS [HARNESS...]   e.g. tools/fuzz.sh 60, tools/fuzz.sh 600 dataset image
#
# Installs clang and compiler-rt if missing (tools/install-deps.sh --with-fuzz), builds the
# harnesses in build-fuzz with clang (coverage, ASan, UBSan: -DDMHNSW_FUZZ=ON), then for each
# harness replays its regression inputs and fuzzes it for SECONDS on a copy of its seed corpus
# (tests/fuzz/corpus/NAME is never grown by a run). Prints one summary line per harness and
# exits 1 when any crashed, leaked, ran out of memory or timed out, naming the input that did.
# Environment: FUZZ_BUILD_DIR (build-fuzz), FUZZ_JOBS (2: build jobs), FUZZ_RSS_MB (2048: the
# memory limit of a harness; one allocation above half of it counts as a crash).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ ]]; then
  sed -n '2,13{s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
fi
secs=$1
shift
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${FUZZ_JOBS:-2}
RSS=${FUZZ_RSS_MB:-2048}

all=()
for f in tests/fuzz/fuzz_*.cpp; do
  n=$(basename "$f" .cpp)
  all+=("${n#fuzz_}")
done
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [[ -f tests/fuzz/fuzz_$h.cpp ]] || { echo "fuzz: no harness '$h' (have: ${all[*]})" >&2; exit 2; }
done

tools/install-deps.sh --with-fuzz
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMHNSW_FUZZ=ON >/dev/null
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"

runs=$BUILD/fuzz-runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$runs"
# Faiss's one-query searches need no OpenMP team; a UBSan finding is a crash with its stack.
export OMP_NUM_THREADS=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# libfabric loads libinfinipath, whose SIGSEGV handler exits quietly: ASan keeps its own.
export ASAN_OPTIONS=${ASAN_OPTIONS:-allow_user_segv_handler=0}
failed=0
tmp=""
trap 'rm -rf "$tmp"' EXIT
printf '%-16s %-8s %12s %8s %8s %8s %9s  %s\n' harness result execs exec/s cov ft corpus "peak rss / artifact"
for h in "${harnesses[@]}"; do
  bin=$BUILD/bin/fuzz_$h
  work=$runs/$h
  mkdir -p "$work/corpus" "$work/artifacts"
  # The files of the harnesses that hand a path to their parser: in memory when there is a
  # tmpfs (25 times the executions of a disk under other jobs' I/O).
  tmp=$(mktemp -d /dev/shm/dmhnsw-fuzz.XXXXXX 2>/dev/null || { mkdir -p "$work/tmp" && echo "$work/tmp"; })
  cp tests/fuzz/corpus/"$h"/* "$work/corpus/"
  result=ok
  # The regression inputs first: each once (libFuzzer runs files given by name).
  regs=()
  if [[ -d tests/fuzz/regressions/$h ]]; then
    while IFS= read -r -d '' f; do regs+=("$f"); done < <(find tests/fuzz/regressions/"$h" -type f ! -name '.*' -print0 | sort -z)
  fi
  regressed=0
  if ((${#regs[@]})) && ! TMPDIR=$tmp "$bin" -rss_limit_mb="$RSS" -malloc_limit_mb=$((RSS / 2)) "${regs[@]}" \
      >"$work/regressions.log" 2>&1; then
    regressed=1
  fi
  set +e
  TMPDIR=$tmp "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb="$RSS" -malloc_limit_mb=$((RSS / 2)) \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" >"$work/fuzz.log" 2>&1
  rc=$?
  set -e
  artifact=$(find "$work/artifacts" -type f | head -1)
  if [[ $rc -ne 0 || -n $artifact ]]; then result=CRASH; fi
  # A timeout that does not happen again when the input runs alone was the host stalling the
  # process (other jobs on the same cores), not a slow input: say so, and go on.
  stall=""
  if [[ $result == CRASH && $artifact == */timeout-* ]] &&
      TMPDIR=$tmp timeout 60 "$bin" -timeout=10 -rss_limit_mb="$RSS" "$artifact" >"$work/timeout-rerun.log" 2>&1; then
    result=ok
    stall=", a stall of the host (timeout not reproduced alone: $artifact)"
  fi
  stat() { grep -a -m1 "^stat::$1:" "$work/fuzz.log" | awk '{print $2}' || true; }
  last=$(grep -a -E '^#[0-9]+' "$work/fuzz.log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  ((regressed)) && result=REGRESSED
  detail="$(stat peak_rss_mb) MB$stall"
  [[ $result == REGRESSED ]] && detail="regression input crashed: $work/regressions.log"
  [[ $result == CRASH ]] && detail="${artifact:-no artifact (exit $rc)}  log: $work/fuzz.log"
  printf '%-16s %-8s %12s %8s %8s %8s %9s  %s\n' "$h" "$result" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$detail"
  [[ $result == ok ]] || failed=1
  rm -rf "$tmp"
done
echo "fuzz: logs, corpora and artifacts in $runs"
if ((failed)); then
  echo "fuzz: FAILED: reproduce with $BUILD/bin/fuzz_NAME ARTIFACT; once fixed, keep the input as tests/fuzz/regressions/NAME/<what-it-was>" >&2
  exit 1
fi
