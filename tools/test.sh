#!/usr/bin/env bash
# Installs dependencies if missing, builds, and runs every test through ctest.
#
#   tools/test.sh [CTEST ARGS]                            build/ (RelWithDebInfo), every test
#   tools/test.sh --sanitize address,undefined [ARGS]     build-asan/: ASan + UBSan + LeakSanitizer
#   tools/test.sh --sanitize thread [ARGS]                build-tsan/: ThreadSanitizer
#
# BUILD_DIR overrides the build directory; other arguments go to ctest (e.g. -R test_fabric).
# A test whose precondition is missing (QEMU, hugepages or network namespaces as root, python3)
# is reported skipped by ctest; the run lists the skipped tests and fails when there are any,
# unless DMHNSW_ALLOW_SKIPS=1 (a machine that lacks them on purpose).
# A sanitized build instruments every target (-O1 -g, cmake -DDMHNSW_SANITIZE=...) and runs
# every test except the soft-RoCE ones (label rxe: each boots a QEMU guest for minutes and runs
# the guest's own binaries). The memnodes, computenodes and tools a test starts are the
# sanitized binaries and inherit the options below; tests/catch_main.cpp collects their reports
# and fails the test that started them. Any report fails: UBSan does not recover, ASan and TSan
# halt on the first error, leaks are reported at exit. Suppressions, each with its reason, are
# in tools/sanitizers/ and name only third-party libraries. Under TSan OpenMP runs one thread
# per parallel region (OMP_THREAD_LIMIT=1, which also caps omp_set_num_threads): libgomp is not
# instrumented, so TSan cannot see its barriers and reported the results of every parallel loop
# (ours, Faiss's) as races; our own threads (std::thread) are all checked.
set -euo pipefail
cd "$(dirname "$0")/.."

# run_ctest BUILD ARGS...: ctest, then the tests it skipped (a precondition missing here: QEMU for
# the soft-RoCE guests, hugepages or network namespaces as root, python3; tests/skip.hpp) named
# and counted. A run with skips fails unless DMHNSW_ALLOW_SKIPS=1: a green run means they ran.
run_ctest() {
  local build=$1 log rc=0 skipped
  shift
  log=$(mktemp)
  ctest --test-dir "$build" "$@" 2>&1 | tee "$log" || rc=$?
  skipped=$(grep -E '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" | sed -E 's/^[[:space:]]*[0-9]+ - //' || true)
  rm -f "$log"
  if [[ -n $skipped ]]; then
    echo "tools/test.sh: $(wc -l <<<"$skipped") test(s) skipped, their precondition missing on this machine:"
    sed 's/^/  /' <<<"$skipped"
    echo "tools/test.sh: why (their own words, from $build/Testing/Temporary/LastTest.log):"
    grep -ohE '(SKIPPED: .*|python3 not found.*)' "$build/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u |
      sed 's/^/  /' || true
    if [[ ${DMHNSW_ALLOW_SKIPS:-0} != 1 && $rc == 0 ]]; then
      echo "tools/test.sh: failing: CI's machines have every precondition (DMHNSW_ALLOW_SKIPS=1 accepts skips)"
      rc=1
    fi
  else
    echo "tools/test.sh: 0 tests skipped"
  fi
  return "$rc"
}

sanitize=""
if [[ ${1:-} == --sanitize ]]; then
  sanitize=${2:?"--sanitize needs address,undefined or thread"}
  shift 2
elif [[ ${1:-} == --sanitize=* ]]; then
  sanitize=${1#--sanitize=}
  shift
fi

if [[ -z $sanitize ]]; then
  BUILD=${BUILD_DIR:-build}
  tools/install-deps.sh --with-rxe  # also qemu and a Debian kernel: the soft-RoCE (label rxe) tests
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$BUILD" -j"$(nproc)"
  # Tests that start processes measure liveness deadlines: run them one at a time on small hosts.
  # The rxe cases boot QEMU guests (tools/rxe-vm.sh); `ctest -LE rxe` leaves them out.
  run_ctest "$BUILD" --output-on-failure --timeout 600 "$@"
  exit
fi

supp=$PWD/tools/sanitizers
case $sanitize in
  address,undefined | undefined,address | address)
    BUILD=${BUILD_DIR:-build-asan}
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ;;
  thread)
    BUILD=${BUILD_DIR:-build-tsan}
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    export OMP_THREAD_LIMIT=1
    ;;
  *)
    echo "test.sh: --sanitize $sanitize: use address,undefined or thread" >&2
    exit 2
    ;;
esac

tools/install-deps.sh  # the sanitizer runtimes (libasan8, libubsan1, libtsan2) are in the base list
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDMHNSW_SANITIZE="$sanitize" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG"
cmake --build "$BUILD" -j"$(nproc)"
run_ctest "$BUILD" --output-on-failure --timeout 900 -LE rxe "$@"
