#!/usr/bin/env bash
# rxe-vm.sh — run a command inside a QEMU guest that has a soft-RoCE (rdma_rxe) device.
#
# This machine has no RDMA NIC and its kernel has no RDMA modules, so tests of the native
# `verbs` transport run in a throw-away guest: Debian's own kernel (linux-image-amd64), the
# host's root filesystem shared read-only over virtio-9p (with a RAM overlay on top, so the
# guest can write anywhere; those writes are lost at power-off, and host files that change
# during the run may look stale: use --share for what must go both ways), and rxe0 on a
# dummy netdev (one guest) or on a virtio NIC joined to a second guest (--pair).
#
# USAGE
#   tools/rxe-vm.sh [options] -- CMD [ARGS...]
#       One guest. rxe0 sits on dummy netdev dmy0 with 10.77.0.1/24; traffic to that address
#       loops back through rxe, so a server and a client in the same guest talk RoCE
#       (lo is up too, for 127.0.0.1 bootstraps). rxe0's GID 1 is the IPv4 RoCEv2 one
#       (perftest: -x 1, or -R for rdma_cm).
#       CMD runs as root, directly (not through a shell), in the caller's current directory,
#       with stdin /dev/null; its stdout/stderr come out on this script's stdout/stderr.
#   tools/rxe-vm.sh --pair [options] -- 'SHELL_CMD_A' 'SHELL_CMD_B'
#       Two guests joined by a virtual Ethernet cable (a QEMU stream netdev over a Unix
#       socket on this host): A has 10.77.0.1, B 10.77.0.2, each with rxe0 on its eth NIC
#       (static ARP entries, MACs 52:54:00:77:00:01/02). Each string runs with `bash -c`.
#       Output lines are prefixed "A| " / "B| ". Both guests see the same shares, so one
#       can wait for a file the other writes (e.g. a ready file in $RXE_SHARE). Host names
#       rxe-a/rxe-b are in /etc/hosts. When one guest fails, the other is stopped
#       20 s later (it is usually waiting for its peer).
#   tools/rxe-vm.sh --check
#       Exit 0 if a guest can run here, else print the reason on stderr and exit 77.
#
# OPTIONS
#   --share DIR      Share host directory DIR read-write, mounted at the same path in the
#                    guest (9p, cache=mmap: writes reach the host at once, shared mmap
#                    works). Repeatable. $RXE_SHARE is the first one; without --share a
#                    fresh temporary directory is shared (and deleted afterwards).
#   --env NAME=VAL   Set NAME in the command's environment; `--env NAME` copies the
#                    caller's value (if set). Repeatable. The environment is otherwise clean:
#                    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin,
#                    HOME (the caller's), LANG=C.UTF-8, plus the RXE_* variables below.
#   --timeout SECS   Kill the guest(s) after SECS seconds of wall time, boot included
#                    (default 600; 0 = never). Exit code 124.
#   --memory SIZE    Guest RAM, QEMU syntax (default 2G). The RAM overlay lives in it.
#   --smp N          vCPUs per guest (default 2, fewer if the guests' vCPUs would outnumber
#                    the host's CPUs: each vCPU is a busy host thread under TCG, and
#                    oversubscription makes latencies jump to 100 ms).
#   --kernel VER     Guest kernel version (default: newest /boot/vmlinuz-VER whose
#                    /lib/modules/VER has rdma_rxe).
#   -v, --verbose    Stream the guest console (kernel messages) and setup log to stderr,
#                    and print timings.
#   -h, --help       This text.
#
# IN THE GUEST
#   RXE_VM=1, RXE_VM_ROLE (single|A|B), RXE_VM_IP (10.77.0.1 or .2), RXE_VM_PEER_IP (--pair
#   only), RXE_VM_DEV=rxe0, RXE_VM_NETDEV (dmy0 or the NIC), RXE_SHARE. Device nodes:
#   /dev/infiniband/uverbs0 and /dev/infiniband/rdma_cm. Loaded: rdma_rxe, ib_uverbs,
#   rdma_ucm (rdma_cm), ib_core; the kernel loads anything else it asks for (crc32, ...)
#   from the host's /lib/modules. RLIMIT_MEMLOCK is unlimited, RLIMIT_NOFILE the caller's.
#   The guest powers off as soon as CMD exits; processes it left in the background get
#   5 s to flush their output and are then killed. The CPU is QEMU's TCG "max" model: AVX2
#   but no AVX-512, so binaries built with -march=native on an AVX-512 host die of SIGILL.
#
# EXIT STATUS
#   CMD's status (--pair: A's if nonzero, else B's); 124 timeout; 125 the guest failed
#   (QEMU did not start, kernel panic, rxe set-up failed; the console tail is printed);
#   77 --check: cannot run here; 2 usage error.
#
# HOW IT WORKS
#   A small initramfs (busybox-static + the virtio/9p/overlay modules of the guest kernel +
#   a hand-written /init) is built once per kernel version into
#   ${XDG_CACHE_HOME:-~/.cache}/dmhnsw-rxe. /init mounts the host root and chroots into it to
#   run a per-run bash script that this script writes into a control directory (a second,
#   writable 9p share): it loads the RDMA modules with the host's modprobe (the 9p root
#   provides /lib/modules/VER), creates rxe0, runs CMD with its stdout/stderr on two
#   virtio-serial ports (piped on the host to our stdout/stderr) and writes CMD's status into
#   the control directory. The kernel console goes to a log file, shown with --verbose or
#   when the guest fails. /dev/kvm cannot boot the stock kernel here, so QEMU uses TCG
#   (-accel tcg,thread=multi -cpu max; ~10x slower than the host). The kernel boots from an
#   uncompressed vmlinux (PVH entry) extracted once into the cache, which saves ~4 s per
#   boot over decompressing the bzImage in the guest. The --pair link is a Unix stream
#   socket, not QEMU's TCP `-netdev socket`: over the latter a 4 KiB READ took 48 ms (vs
#   0.8 ms), the signature of Nagle's algorithm meeting delayed ACKs.
#   Environment overrides: RXE_VM_QEMU (QEMU binary), RXE_VM_CACHE_DIR.
#
# TIMINGS (2-CPU host, TCG): a one-guest run of `true` takes ~4.5 s on an idle host (the
#   command starts ~4 s after kernel start), 10-17 s when other jobs load the host. rxe0 in
#   one guest: 512 B READ ~40 us, 8 B FETCH_ADD/CMP_SWAP ~21 us, 64 B SEND ~13 us (perftest
#   t_typical); --pair: ~0.5-1 ms per round trip, multi-packet ones included.
#
# Needs (tools/install-deps.sh --with-rxe): qemu-system-x86 linux-image-amd64 busybox-static
# kmod cpio xz-utils iproute2 (and perftest rdmacm-utils ibverbs-utils for hand checks).

set -euo pipefail

readonly EXIT_SKIP=77 EXIT_TIMEOUT=124 EXIT_VMFAIL=125 EXIT_USAGE=2
readonly QEMU=${RXE_VM_QEMU:-qemu-system-x86_64}
readonly BUSYBOX=/bin/busybox
readonly GUEST_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
readonly MSIZE=262144   # 9p message size: larger messages make file reads much faster
# Modules /init loads (with their dependencies) before it can reach the 9p root.
readonly INITRD_MODULES=(virtio_pci 9pnet_virtio 9p overlay virtio_console)
readonly INITRAMFS_REV=3  # bump when ensure_initramfs changes what goes in
readonly PAIR_GRACE=20  # seconds a guest may go on after its peer failed

# ---- option parsing -------------------------------------------------------------------

opt_check=0 opt_pair=0 opt_verbose=0 opt_timeout=600 opt_memory=2G opt_smp="" opt_kernel=""
opt_shares=() opt_envs=() cmd=()

log() { printf 'rxe-vm: %s\n' "$*" >&2; }
usage_error() { log "$*"; log "see tools/rxe-vm.sh --help"; exit "$EXIT_USAGE"; }
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

parse_args() {
  while (($#)); do
    case $1 in
      --check) opt_check=1 ;;
      --pair) opt_pair=1 ;;
      -v|--verbose) opt_verbose=1 ;;
      -h|--help) usage; exit 0 ;;
      --share|--env|--timeout|--memory|--smp|--kernel)
        (($# >= 2)) || usage_error "$1 needs a value"
        case $1 in
          --share) [[ -d $2 ]] || usage_error "--share $2: not a directory"
                   opt_shares+=("$(realpath -e -- "$2")") ;;
          --env) [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*(=|$) ]] || usage_error "--env $2: want NAME=VALUE or NAME"
                 if [[ $2 == *=* ]]; then opt_envs+=("$2")
                 elif [[ -v $2 ]]; then opt_envs+=("$2=${!2}"); fi ;;
          --timeout) [[ $2 =~ ^[0-9]+$ ]] || usage_error "--timeout $2: want whole seconds"
                     opt_timeout=$2 ;;
          --memory) opt_memory=$2 ;;
          --smp) [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "--smp $2: want a positive count"
                 opt_smp=$2 ;;
          --kernel) opt_kernel=$2 ;;
        esac
        shift ;;
      --) shift; cmd=("$@"); break ;;
      *) usage_error "unknown option $1 (the command goes after --)" ;;
    esac
    shift
  done
  ((opt_check)) && return 0
  if [[ -z $opt_smp ]]; then
    local guests=$((opt_pair ? 2 : 1)) cpus
    cpus=$(nproc 2>/dev/null || echo 2)
    opt_smp=$((cpus / guests))
    if ((opt_smp > 2)); then opt_smp=2; elif ((opt_smp < 1)); then opt_smp=1; fi
  fi
  if ((opt_pair)); then
    ((${#cmd[@]} == 2)) || usage_error "--pair wants exactly two shell commands after --"
  else
    ((${#cmd[@]} >= 1)) || usage_error "no command given (tools/rxe-vm.sh [options] -- CMD [ARGS...])"
  fi
}

# ---- host requirements ----------------------------------------------------------------

# Newest installed Debian kernel that has the rxe driver (or --kernel), printed on stdout.
find_kernel() {
  local v best=""
  if [[ -n $opt_kernel ]]; then
    best=$opt_kernel
  else
    for v in $(find /boot -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' 2>/dev/null \
               | sed 's/^vmlinuz-//' | sort -V); do
      [[ -d /lib/modules/$v/kernel/drivers/infiniband/sw/rxe ]] && best=$v
    done
  fi
  [[ -n $best ]] || { echo "no /boot/vmlinuz-* with rdma_rxe in /lib/modules (install linux-image-amd64)"; return 1; }
  [[ -r /boot/vmlinuz-$best ]] || { echo "/boot/vmlinuz-$best missing or unreadable"; return 1; }
  [[ -d /lib/modules/$best/kernel/drivers/infiniband/sw/rxe ]] \
    || { echo "/lib/modules/$best has no rdma_rxe"; return 1; }
  [[ -s /lib/modules/$best/modules.dep ]] || { echo "/lib/modules/$best/modules.dep missing (run depmod $best)"; return 1; }
  echo "$best"
}

# Prints why a guest cannot run here (and returns 1), or nothing.
why_cannot_run() {
  local t kver
  for t in "$QEMU" modprobe cpio realpath; do
    command -v "$t" >/dev/null || { echo "$t not found (tools/install-deps.sh --with-rxe)"; return 1; }
  done
  [[ -x $BUSYBOX ]] || { echo "$BUSYBOX not found (busybox-static)"; return 1; }
  # The initramfs has no libc: busybox must be the static build.
  if LC_ALL=C ldd "$BUSYBOX" 2>&1 | grep -q '=>'; then
    echo "$BUSYBOX is dynamically linked (install busybox-static)"; return 1
  fi
  kver=$(find_kernel) || { echo "$kver"; return 1; }
  "$QEMU" -device help 2>/dev/null | grep -q '"virtio-9p-pci"' \
    || { echo "$QEMU lacks virtio-9p-pci"; return 1; }
  return 0
}

# ---- initramfs ------------------------------------------------------------------------

# PID 1 of the guest (busybox sh). Mounts the host root (9p, read-only) under a tmpfs
# overlay, the control share at /run/rxe-vm, and runs the per-run script there in a chroot.
# Whatever happens, it powers off, so QEMU (-no-reboot) exits.
read -r -d '' INIT_SCRIPT <<'EOF' || true
#!/bin/sh
export PATH=/bin
mount -t devtmpfs dev /dev
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
fail() { echo "rxe-vm-init: FAILED: $*"; poweroff -f; sleep 30; }
while read -r ko; do
  insmod "/modules/$ko" || fail "insmod $ko"
done </modules/order
R=/newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=@MSIZE@ root /mnt/lower \
  || fail "mount of the host root (9p tag root)"
mount -t tmpfs -o mode=0755 rw /mnt/rw && mkdir /mnt/rw/upper /mnt/rw/work || fail "tmpfs"
mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay $R \
  || fail "overlay root"
mount -t proc proc $R/proc && mount -t sysfs sys $R/sys && mount -t devtmpfs dev $R/dev \
  || fail "proc/sys/dev"
mkdir -p $R/dev/pts $R/dev/shm $R/dev/hugepages
# What udev would add and programs expect (`tee /dev/stdout`, bash's <(...) via /dev/fd).
ln -s /proc/self/fd $R/dev/fd
ln -s /proc/self/fd/0 $R/dev/stdin
ln -s /proc/self/fd/1 $R/dev/stdout
ln -s /proc/self/fd/2 $R/dev/stderr
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mount -t hugetlbfs hugetlbfs $R/dev/hugepages
mount -t tmpfs -o mode=0755 run $R/run && mkdir $R/run/rxe-vm || fail "/run"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=@MSIZE@ ctl $R/run/rxe-vm \
  || fail "mount of the control share (9p tag ctl)"
# Modules the kernel requests itself (rxe needs crc32 from the crypto API, rdma_cm its
# ports, ...) must come from the host's module tree: the kernel's modprobe helper runs in
# this root, so point it at a wrapper that runs the host's modprobe in the chroot.
echo /bin/modprobe-chroot >/proc/sys/kernel/modprobe
chroot $R /bin/bash /run/rxe-vm/stage2 || echo "rxe-vm-init: stage2 exited with $?"
sync
poweroff -f
sleep 30
EOF

# Prints the path of an initramfs for kernel $1 in cache dir $2, building it if missing.
ensure_initramfs() {
  local kver=$1 cache key out tmp m ko n=0 line
  local init=${INIT_SCRIPT//@MSIZE@/$MSIZE}
  # Module files in load order: modprobe resolves dependencies from the guest kernel's
  # modules.dep; built-in modules print "builtin ..." and are skipped.
  local -a kos=()
  local -A seen=()
  for m in "${INITRD_MODULES[@]}"; do
    while read -r line; do
      [[ $line == insmod\ * ]] || continue
      ko=${line#insmod }; ko=${ko%% *}
      [[ -n ${seen[$ko]:-} ]] && continue
      seen[$ko]=1; kos+=("$ko")
    done < <(modprobe -S "$kver" --show-depends "$m")
  done
  # The cache key covers everything that goes in, so edits to /init or a kernel update
  # (same version string, new build) produce a new file.
  key=$( { printf '%s\n' "$init" "${kos[@]}" "$INITRAMFS_REV"; stat -L -c '%s %Y' "$BUSYBOX" "${kos[@]}"; } \
        | sha256sum | cut -c1-16)
  cache=$2
  out=$cache/initramfs-$kver-$key.cpio
  if [[ ! -s $out ]]; then
    tmp=$(mktemp -d "$work/initramfs.XXXXXX")
    mkdir -p "$tmp"/{bin,dev,proc,sys,mnt/lower,mnt/rw,newroot,modules}
    cp "$BUSYBOX" "$tmp/bin/busybox"
    for m in sh mount insmod chroot mkdir ln poweroff sleep sync; do ln -s busybox "$tmp/bin/$m"; done
    for ko in "${kos[@]}"; do
      n=$((n + 1)); m=$(printf '%02d-%s' "$n" "$(basename "${ko%.ko*}").ko")
      case $ko in   # busybox insmod wants plain ELF
        *.ko.xz) xz -dc "$ko" >"$tmp/modules/$m" ;;
        *.ko.zst) zstd -qdc "$ko" >"$tmp/modules/$m" ;;
        *.ko.gz) gzip -dc "$ko" >"$tmp/modules/$m" ;;
        *) cp "$ko" "$tmp/modules/$m" ;;
      esac
      echo "$m" >>"$tmp/modules/order"
    done
    printf '%s\n' "$init" >"$tmp/init"
    printf '#!/bin/sh\nexec /bin/chroot /newroot /sbin/modprobe "$@"\n' >"$tmp/bin/modprobe-chroot"
    chmod 755 "$tmp/init" "$tmp/bin/modprobe-chroot"
    # Uncompressed: the kernel unpacks it faster than it would decompress it under TCG.
    # Written under a temporary name and renamed, so concurrent runs never see half a file.
    (cd "$tmp" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$out.$$.tmp"
    mv -f "$out.$$.tmp" "$out"
    rm -rf "$tmp"
    # Drop initramfs images of this kernel built from older inputs.
    find "$cache" -maxdepth 1 -name "initramfs-$kver-*.cpio" ! -name "${out##*/}" ! -name "*.tmp" -delete 2>/dev/null || true
  fi
  echo "$out"
}

# Prints the kernel image to boot for version $1. QEMU boots an uncompressed vmlinux through
# its PVH entry point directly; decompressing the xz bzImage in the guest under TCG takes
# ~4 s of every boot, so the vmlinux is extracted once into the cache. Falls back to the
# bzImage if the kernel lacks PVH or the payload cannot be extracted.
ensure_vmlinux() {
  local kver=$1 img=/boot/vmlinuz-$1 cache=$2 out key off
  if ! grep -q '^CONFIG_PVH=y' "/boot/config-$kver" 2>/dev/null || ! command -v xz >/dev/null; then
    echo "$img"; return
  fi
  key=$(stat -L -c '%s %Y' "$img" | sha256sum | cut -c1-16)
  out=$cache/vmlinux-$kver-$key
  if [[ ! -s $out ]]; then
    # The bzImage's payload is one xz stream (Debian: CONFIG_KERNEL_XZ).
    off=$(LC_ALL=C grep -m1 -abo $'\xfd7zXZ\x00' "$img" | head -n1 | cut -d: -f1) || true
    # (tail dies of SIGPIPE once xz has read the one stream; only xz's status counts.)
    if [[ -z $off ]] || ! { tail -c +$((off + 1)) "$img" 2>/dev/null || true; } \
                           | xz -dc --single-stream >"$out.$$.tmp" 2>/dev/null \
       || [[ $(head -c 4 "$out.$$.tmp") != $'\x7fELF' ]]; then
      rm -f "$out.$$.tmp"; echo "$img"; return
    fi
    mv -f "$out.$$.tmp" "$out"
    find "$cache" -maxdepth 1 -name "vmlinux-$kver-*" ! -name "${out##*/}" ! -name "*.tmp" -delete 2>/dev/null || true
  fi
  echo "$out"
}

# ---- per-guest run script ---------------------------------------------------------------

# Writes the script the guest runs (as /run/rxe-vm/stage2) into control dir $1 for role $2
# (single|A|B); the command is in the remaining arguments.
write_stage2() {
  local ctl=$1 role=$2; shift 2
  local ip=10.77.0.1 peer_ip="" peer_mac="" mac="" netdev=dmy0 host=rxe-vm
  case $role in
    A) ip=10.77.0.1 mac=52:54:00:77:00:01 peer_ip=10.77.0.2 peer_mac=52:54:00:77:00:02 host=rxe-a ;;
    B) ip=10.77.0.2 mac=52:54:00:77:00:02 peer_ip=10.77.0.1 peer_mac=52:54:00:77:00:01 host=rxe-b ;;
  esac
  local -a env=("PATH=$GUEST_PATH" "HOME=${HOME:-/root}" "LANG=C.UTF-8" "RXE_VM=1"
                "RXE_VM_ROLE=$role" "RXE_VM_IP=$ip" "RXE_VM_DEV=rxe0" "RXE_SHARE=${shares[0]}")
  [[ -n $peer_ip ]] && env+=("RXE_VM_PEER_IP=$peer_ip")
  env+=("${opt_envs[@]}")
  {
    echo '#!/bin/bash'
    echo "# Generated by tools/rxe-vm.sh for guest $role."
    printf 'ROLE=%q IP=%q MAC=%q PEER_IP=%q PEER_MAC=%q NETDEV=%q HOST=%q CWD=%q NOFILE=%q\n' \
      "$role" "$ip" "$mac" "$peer_ip" "$peer_mac" "$netdev" "$host" "$PWD" "$(ulimit -n)"
    printf 'SHARES=(%s)\n' "$(printf '%q ' "${shares[@]}")"
    printf 'ENVS=(%s)\n' "$(printf '%q ' "${env[@]}")"
    printf 'CMD=(%s)\n' "$(printf '%q ' "$@")"
    cat <<'EOF'
ctl=/run/rxe-vm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec </dev/null 2>>$ctl/setup.log >&2
stamp() { read -r up _ </proc/uptime; echo "$up" >"$ctl/$1"; }
stamp t_stage2

# Modules, network, rxe0, shares. Any failure: the host reports setup.log and exits 125.
# Every process costs ~0.1-0.3 s under TCG (exec, dynamic linking over 9p), so set-up
# uses few: one modprobe, one ip -batch, one rdma.
setup() {
  PS4='+ [${EPOCHREALTIME}] '
  set -x
  echo "$HOST" >/proc/sys/kernel/hostname
  printf '%s %s\n' "$IP" "$HOST" >>/etc/hosts          # the root is a RAM overlay
  [[ -z $PEER_IP ]] || printf '%s rxe-%s\n' "$PEER_IP" "$([[ $ROLE == A ]] && echo b || echo a)" >>/etc/hosts
  # Host config must not shape the guest's modules; no spare dummy0 either.
  echo "options dummy numdummies=0" >/etc/modprobe.d/zz-rxe-vm.conf
  if [[ $ROLE == single ]]; then nic_mod=dummy; else nic_mod=virtio_net; fi
  # Explicitly: nothing in the guest would load them on demand (no udev).
  modprobe -a "$nic_mod" ib_uverbs rdma_ucm rdma_rxe
  if [[ $ROLE == single ]]; then
    ipcmds="link add $NETDEV type dummy"$'\n'
  else
    NETDEV=""
    for d in /sys/class/net/*; do [[ $(<"$d/address") == "$MAC" ]] && NETDEV=${d##*/}; done
    [[ -n $NETDEV ]] || { echo "no NIC with MAC $MAC"; false; }
    # Static ARP: the peer may boot later, and rdma_cm/rxe must not wait for resolution.
    ipcmds="neigh replace $PEER_IP lladdr $PEER_MAC dev $NETDEV nud permanent"$'\n'
  fi
  ip -batch - <<<"${ipcmds}link set lo up
addr add $IP/24 dev $NETDEV
link set $NETDEV up"
  rdma link add rxe0 type rxe netdev "$NETDEV"
  { set +x; } 2>/dev/null
  for ((i = 0; i < 100; i++)); do   # devtmpfs makes the nodes as the devices register
    [[ -c /dev/infiniband/uverbs0 && -c /dev/infiniband/rdma_cm ]] && break
    sleep 0.05
  done
  set -x
  [[ -c /dev/infiniband/uverbs0 && -c /dev/infiniband/rdma_cm ]]
  n=0
  for s in "${SHARES[@]}"; do
    [[ -d $s ]] || mkdir -p "$s"   # e.g. under a path the guest sees differently
    mount -t 9p -o trans=virtio,version=9p2000.L,cache=mmap,msize=262144 "share$n" "$s"
    n=$((n + 1))
  done
  { set +x; } 2>/dev/null
}
# set -e with an ERR trap rather than a subshell: `if ! (setup)` would disable set -e.
trap 'echo "set-up failed" >$ctl/setup-failed; exit 1' ERR
set -eE -o pipefail
setup
set +eE +o pipefail
trap - ERR
ENVS=("RXE_VM_NETDEV=$NETDEV" "${ENVS[@]}")   # --env NAME=... later in the list wins

# CMD's stdout/stderr go through pipes to relays that write the virtio-serial ports: a
# port can be open only once, and CMD may well reopen /dev/stdout.
port() { for p in /sys/class/virtio-ports/*; do [[ $(<"$p/name") == "$1" ]] && echo "/dev/${p##*/}"; done; }
out=$(port stdout) err=$(port stderr)
mkfifo /run/out /run/err
cat /run/out >"$out" & relay_out=$!
cat /run/err >"$err" & relay_err=$!
ulimit -l unlimited                     # ibv_reg_mr pins memory
ulimit -n "$NOFILE" 2>/dev/null || true  # the caller's open-files limit, not the kernel's 1024
stamp t_cmd_start
(
  cd "$CWD" || exit 126
  exec env -i "${ENVS[@]}" "${CMD[@]}"
) >/run/out 2>/run/err
rc=$?
stamp t_cmd_end
echo "$rc" >$ctl/status
# Let the relays drain; background processes CMD left behind may hold the pipes open.
for ((i = 0; i < 50; i++)); do
  kill -0 $relay_out 2>/dev/null || kill -0 $relay_err 2>/dev/null || break
  sleep 0.1
done
exit 0
EOF
  } >"$ctl/stage2"
}

# ---- running guests ---------------------------------------------------------------------

work=""          # per-run temporary directory (control dirs, fifos, sockets)
shares=()        # host directories shared read-write
tmp_share=""     # the default share, deleted at exit
declare -A qpid=() relays=() state=() t_start=() t_end=()
roles=()

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local r p
  for r in "${roles[@]}"; do
    p=${qpid[$r]:-}
    [[ -n $p ]] && kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null
  done
  # A relay still blocked opening its fifo (QEMU never started) is released by a writer.
  for p in "$work"/*.fifo; do [[ -p $p ]] && : 1<>"$p"; done 2>/dev/null
  wait 2>/dev/null || true
  [[ -n $tmp_share ]] && rm -rf "$tmp_share"
  [[ -n $work ]] && rm -rf "$work"
  return 0
}

# Starts guest $1 (single|A|B) in the background; the command is in the other arguments.
# shellcheck disable=SC2054  # commas inside QEMU option values, not array separators
start_guest() {
  local role=$1; shift
  local ctl=$work/$role prefix="" n=0 s
  mkdir -p "$ctl"
  write_stage2 "$ctl" "$role" "$@"
  [[ $role != single ]] && prefix="$role| "
  # Relays from QEMU's character devices (fifos) to our stdout/stderr.
  mkfifo "$work/$role-out.fifo" "$work/$role-err.fifo"
  if [[ -z $prefix ]]; then
    cat <"$work/$role-out.fifo" & relays[$role]="$!"
    cat <"$work/$role-err.fifo" >&2 & relays[$role]+=" $!"
  else
    sed -u "s/^/$prefix/" <"$work/$role-out.fifo" & relays[$role]="$!"
    sed -u "s/^/$prefix/" <"$work/$role-err.fifo" >&2 & relays[$role]+=" $!"
  fi
  local -a args=(
    -nodefaults -no-user-config -display none -monitor none -no-reboot
    -accel tcg,thread=multi -cpu max -m "$opt_memory" -smp "$opt_smp"
    -kernel "$kimage" -initrd "$initrd"
    # quiet boot; panic/oops end the VM at once (-no-reboot); no PTI & co. (it costs a lot
    # under TCG); TSC is fine as clocksource under TCG, the watchdogs only misfire there;
    # the crypto self-tests alone take 0.3 s of boot.
    -append "console=ttyS0 quiet loglevel=4 panic=-1 oops=panic mitigations=off tsc=reliable nowatchdog cryptomgr.notests 8250.nr_uarts=1 rdinit=/init"
    -chardev "file,id=con,path=$ctl/console.log" -serial chardev:con
    -fsdev "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap"
    -device virtio-9p-pci,fsdev=root,mount_tag=root
    -fsdev "local,id=ctl,path=$ctl,security_model=none"
    -device virtio-9p-pci,fsdev=ctl,mount_tag=ctl
    -device virtio-serial-pci,id=vs
    -chardev "file,id=out,path=$work/$role-out.fifo" -device virtserialport,bus=vs.0,chardev=out,name=stdout
    -chardev "file,id=err,path=$work/$role-err.fifo" -device virtserialport,bus=vs.0,chardev=err,name=stderr
  )
  for s in "${shares[@]}"; do
    args+=(-fsdev "local,id=share$n,path=$s,security_model=none,multidevs=remap"
           -device "virtio-9p-pci,fsdev=share$n,mount_tag=share$n")
    n=$((n + 1))
  done
  case $role in
    A) args+=(-netdev "stream,id=net,server=on,addr.type=unix,addr.path=$work/link.sock"
              -device virtio-net-pci,netdev=net,mac=52:54:00:77:00:01) ;;
    B) args+=(-netdev "stream,id=net,server=off,addr.type=unix,addr.path=$work/link.sock"
              -device virtio-net-pci,netdev=net,mac=52:54:00:77:00:02) ;;
  esac
  t_start[$role]=$EPOCHREALTIME
  "$QEMU" "${args[@]}" </dev/null >"$ctl/qemu.log" 2>&1 &
  qpid[$role]=$!
  state[$role]=running
  roles+=("$role")
  if ((opt_verbose)); then
    tail -n +1 -F --pid="${qpid[$role]}" "$ctl/console.log" 2>/dev/null \
      | sed -u "s/\r\$//; s/^/[$role console] /" >&2 &
    relays[$role]+=" $!"
  fi
}

# Prints what explains guest $1's failure to stderr: the panic line, QEMU's messages, the
# set-up trace if the command never started, and the tail of the kernel console.
show_logs() {
  local role=$1 ctl=$work/$1 f panic
  panic=$(grep -a -m1 -E 'Kernel panic|rxe-vm-init: FAILED' "$ctl/console.log" 2>/dev/null | tr -d '\r') || true
  [[ -n $panic ]] && log "guest $role: $panic"
  for f in qemu.log setup.log console.log; do
    [[ -s $ctl/$f ]] || continue
    [[ $f == setup.log && -e $ctl/t_cmd_start ]] && continue
    log "--- guest $role: $f (last 40 lines) ---"
    tail -n 40 "$ctl/$f" | tr -d '\r' >&2
  done
  log "--- end of guest $role logs ---"
}

# Waits for all guests; kills them at the deadline. Sets state[role] to done|crashed|
# timeout|stopped.
supervise() {
  local now deadline="" r p rc any_running peer_failed_at=""
  ((opt_timeout > 0)) && deadline=$((EPOCHSECONDS + opt_timeout))
  while :; do
    any_running=0
    for r in "${roles[@]}"; do
      [[ ${state[$r]} == running ]] || continue
      p=${qpid[$r]}
      if kill -0 "$p" 2>/dev/null; then any_running=1; continue; fi
      rc=0; wait "$p" || rc=$?
      t_end[$r]=$EPOCHREALTIME
      if [[ -s $work/$r/status ]]; then
        state[$r]="done"
        [[ $(<"$work/$r/status") == 0 ]] || peer_failed_at=${peer_failed_at:-$EPOCHSECONDS}
      else
        state[$r]=crashed
        peer_failed_at=${peer_failed_at:-$EPOCHSECONDS}
        [[ $rc == 0 ]] || echo "qemu exited with status $rc" >>"$work/$r/qemu.log"
      fi
    done
    ((any_running)) || break
    now=$EPOCHSECONDS
    if [[ -n $deadline ]] && ((now >= deadline)); then
      for r in "${roles[@]}"; do
        [[ ${state[$r]} == running ]] || continue
        state[$r]=timeout; kill -TERM "${qpid[$r]}" 2>/dev/null || true
      done
    elif [[ -n $peer_failed_at ]] && ((now >= peer_failed_at + PAIR_GRACE)); then
      # In --pair, a guest whose peer failed usually waits for it forever.
      for r in "${roles[@]}"; do
        [[ ${state[$r]} == running ]] || continue
        log "guest $r still running ${PAIR_GRACE}s after its peer failed; stopping it"
        state[$r]=stopped; kill -TERM "${qpid[$r]}" 2>/dev/null || true
      done
    fi
    sleep 0.2
  done
  for r in "${roles[@]}"; do   # guests killed above
    wait "${qpid[$r]}" 2>/dev/null || true
    t_end[$r]=${t_end[$r]:-$EPOCHREALTIME}
  done
}

# Guest uptime stamps and wall times, for --verbose.
report_times() {
  local r c ran
  for r in "${roles[@]}"; do
    c=$work/$r
    [[ -s $c/t_cmd_start ]] || continue
    ran="did not finish"
    [[ -s $c/t_cmd_end ]] && ran="ran $(awk -v a="$(<"$c/t_cmd_start")" -v b="$(<"$c/t_cmd_end")" \
                                          'BEGIN{printf "%.2f", b-a}') s"
    log "guest $r: command started $(<"$c/t_cmd_start") s after kernel start, $ran;" \
        "QEMU wall time $(awk -v a="${t_start[$r]}" -v b="${t_end[$r]}" 'BEGIN{printf "%.2f", b-a}') s"
  done
}

main() {
  parse_args "$@"
  local why
  if ((opt_check)); then
    if why=$(why_cannot_run); then echo "rxe-vm: ok (kernel $(find_kernel), TCG)"; exit 0; fi
    log "cannot run a guest here: $why"; exit "$EXIT_SKIP"
  fi
  why=$(why_cannot_run) || { log "cannot run a guest here: $why"; exit "$EXIT_SKIP"; }
  kver=$(find_kernel)

  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  work=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
  local cache=${RXE_VM_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/dmhnsw-rxe}
  mkdir -p "$cache" 2>/dev/null && [[ -w $cache ]] || cache=$work   # read-only home: per run
  initrd=$(ensure_initramfs "$kver" "$cache")
  kimage=$(ensure_vmlinux "$kver" "$cache")
  shares=("${opt_shares[@]}")
  if ((${#shares[@]} == 0)); then
    tmp_share=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm-share.XXXXXX")
    shares=("$tmp_share")
  fi
  ((opt_verbose)) && log "kernel $kver ($kimage), initramfs $initrd, work dir $work, shares: ${shares[*]}"

  if ((opt_pair)); then
    start_guest A bash -c "${cmd[0]}"
    # B connects to A's socket; QEMU 7.2 does not retry, so wait until A listens on it.
    local i
    for ((i = 0; i < 100; i++)); do [[ -S $work/link.sock ]] && break; sleep 0.05; done
    sleep 0.2
    start_guest B bash -c "${cmd[1]}"
  else
    start_guest single "${cmd[@]}"
  fi
  supervise

  # The relays end when QEMU closes the fifos.
  local r p
  for r in "${roles[@]}"; do for p in ${relays[$r]}; do wait "$p" 2>/dev/null || true; done; done
  if ((opt_verbose)); then
    report_times
    for r in "${roles[@]}"; do
      [[ -s $work/$r/setup.log ]] || continue
      log "--- guest $r: setup.log ---"; tr -d '\r' <"$work/$r/setup.log" >&2
    done
  fi

  local status=0 first_cmd_fail="" timed_out=0 crashed=0
  for r in "${roles[@]}"; do
    case ${state[$r]} in
      done) local s; s=$(<"$work/$r/status")
            [[ $s != 0 && -z $first_cmd_fail ]] && first_cmd_fail=$s ;;
      timeout) timed_out=1
               log "timeout: guest $r still running after ${opt_timeout}s (--timeout); killed it"
               show_logs "$r" ;;
      stopped) ;;
      crashed) crashed=1
               if [[ -e $work/$r/setup-failed ]]; then log "guest $r: rxe set-up failed"
               else log "guest $r ended without reporting a status (QEMU failed, kernel panic or /init failed)"; fi
               show_logs "$r" ;;
    esac
  done
  if [[ -n $first_cmd_fail ]]; then status=$first_cmd_fail
  elif ((timed_out)); then status=$EXIT_TIMEOUT
  elif ((crashed)); then status=$EXIT_VMFAIL
  fi
  exit "$status"
}

main "$@"
