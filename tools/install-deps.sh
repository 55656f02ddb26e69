#!/usr/bin/env bash
# Installs every build and run dependency of dmhnsw from Debian packages.
# Idempotent: does nothing when all packages are present. Needs root (or sudo).
#
#   tools/install-deps.sh              build and run dependencies
#   tools/install-deps.sh --with-rxe   also what tools/rxe-vm.sh needs to run the verbs
#                                      transport's tests in a QEMU guest with soft-RoCE
#   tools/install-deps.sh --with-fuzz  also clang with libFuzzer and the sanitizer runtimes
#                                      (libclang-rt-14-dev) and clang's OpenMP, for tools/fuzz.sh
set -euo pipefail

with_rxe=0
with_fuzz=0
for arg in "$@"; do
  case $arg in
    --with-rxe) with_rxe=1 ;;
    --with-fuzz) with_fuzz=1 ;;
    -h|--help) sed -n '2,9{s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done

PKGS=(
  build-essential cmake ninja-build pkg-config
  libtsan2 libasan8 libubsan1  # gcc's TSan, ASan and UBSan runtimes (test_cache_tsan; tools/test.sh --sanitize)
  libfabric-dev libfabric1 libibverbs-dev librdmacm-dev rdma-core ibverbs-utils
  libhnswlib-dev libfaiss-dev libopenblas-dev liblapack-dev
  libspdlog-dev libfmt-dev libcli11-dev catch2 libnuma-dev nlohmann-json3-dev
  libssl-dev  # OpenSSL's libcrypto: HMAC-SHA256 of the control hello
  libxxhash-dev  # XXH3: the shine id index's hash
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # computenode serve (proto/dmhnsw.proto)
  libcpp-httplib-dev  # computenode serve --metrics-listen (Prometheus text exposition)
  python3-venv python3-pip  # the Python client: a virtualenv and pip install ./python
  python3-grpcio python3-protobuf python3-setuptools python3-wheel  # the Python client offline (python/README.md)
  python3-numpy python3-matplotlib iproute2 procps
  python3-hnswlib  # experiments/churn: hnswlib's mark_deleted beside shine's deletes
  gdb  # tests append the stacks of a process that misses a deadline to its log
  linux-perf  # profiles of the search and build paths (experiments/vs_hnswlib)
  nftables  # experiments/chaos: packet loss between network namespaces (this kernel has no netem)
  slurmctld slurmd slurm-client  # tools/slurm-local.sh: a one-host Slurm for deploy/slurm/'s tests (auth/none; munge comes along unused)
)
if ((with_rxe)); then
  PKGS+=(
    qemu-system-x86    # TCG guest (this host's /dev/kvm cannot run the stock kernel)
    linux-image-amd64  # guest kernel, and the rdma_rxe/9p/virtio modules in /lib/modules
    busybox-static     # the guest initramfs' shell and tools (no libc there)
    kmod cpio xz-utils # module dependencies, initramfs packing, vmlinux extraction
    perftest rdmacm-utils ibverbs-utils  # ib_*_lat, rping/udaddy, ibv_devinfo: hand checks
  )
fi
if ((with_fuzz)); then
  PKGS+=(
    clang               # Debian's default clang (14 on bookworm)
    libclang-rt-14-dev  # compiler-rt: libclang_rt.fuzzer, asan, ubsan
    libomp-14-dev       # clang's -fopenmp (faiss's CMake package asks for OpenMP)
  )
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists when they are missing or older than a day.
if [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1) ]]; then
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
