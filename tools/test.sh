#!/usr/bin/env bash
# Installs dependencies if missing, builds, and runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}

tools/install-deps.sh --with-rxe  # also qemu and a Debian kernel: the soft-RoCE (label rxe) tests
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j"$(nproc)"
# Tests that start processes measure liveness deadlines: run them one at a time on small hosts.
# The rxe cases boot QEMU guests (tools/rxe-vm.sh); `ctest -LE rxe` leaves them out.
ctest --test-dir "$BUILD" --output-on-failure --timeout 600 "$@"
