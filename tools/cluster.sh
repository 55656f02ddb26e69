#!/usr/bin/env bash
# cluster.sh: a dmhnsw cluster on this host, started in the background and kept until `down`.
#
#   tools/cluster.sh up [--dir DIR] [--memnodes N] [--replicas R] [--region SIZE] [--provider shm|tcp|cxl]
#                       [--token] [--load IMGDIR] [--serve MODE] [--serve-listen HOST:PORT] [--bin DIR]
#       N x R memnodes (default 2 x 1, 256MiB each, shm) on 127.0.0.1 with free ports; --token (always
#       with tcp) makes DIR/cluster.token (mode 0600) and uses it; --load serves IMGDIR/memnode-<id>.img
#       (images that `build --store-index DIR/images` wrote); --serve shine|dhnsw also starts
#       `computenode serve` (it needs an index: use --load, or `serve` after a build).
#   tools/cluster.sh serve MODE [--dir DIR] [--serve-listen HOST:PORT] [--bin DIR] [-- extra serve flags]
#   tools/cluster.sh status [--dir DIR] [--bin DIR]   every process alive or dead, and the region headers
#                                                     (exit 0: all alive, 1: not, 2: no cluster in DIR)
#   tools/cluster.sh down [--dir DIR]                 stops them (logs, images, token are kept)
#
# DIR (default runs/cluster) holds the logs (mn<id>.<copy>.log, serve.log), the ready files,
# cluster.pids ("memnode ID COPY PID ADDR" / "serve MODE PID ADDR" lines) and cluster.env:
#   source DIR/cluster.env   # MEMNODES, PROVIDER, TOKEN_FILE, CLUSTER_DIR, CLUSTER_BIN [, SERVE]
#   build/bin/computenode --provider $PROVIDER [--token-file $TOKEN_FILE] --memnodes $MEMNODES --mode shine \
#       build --data base.fvecs
# The binaries come from --bin DIR, by default build/bin of this repository.
set -euo pipefail

me=cluster.sh
DIR=runs/cluster N=2 R=1 REGION=256MiB PROVIDER=shm TOKEN=0 LOAD="" SERVE_MODE="" LISTEN=127.0.0.1:0 BIN=""
EXTRA=() PIDS=() STARTED=() TOKARGS=()
MEMNODES="" TOKEN_FILE="" SERVE="" CLUSTER_BIN=""

say() { echo "$me: $*"; }
usage() { sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }
die() { echo "$me: $1" >&2; exit "${2:-2}"; }
# shellcheck source=tools/pids.sh
source "$(dirname "${BASH_SOURCE[0]}")/pids.sh"  # running, stop

# ours PID: a running process (tools/pids.sh) that is one of this cluster's
# memnodes or computenodes (its command line names DIR), so a reused pid is never signalled.
ours() {
  local cmd
  running "$1" && cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  [[ ($cmd == *memnode* || $cmd == *computenode*) && $cmd == *"$DIR/"* ]]
}


write_file() {  # write_file NAME < content: whole or not at all (temporary file, then rename)
  cat >"$DIR/.$1.tmp"
  mv -f "$DIR/.$1.tmp" "$DIR/$1"
}
write_pids() { if ((${#PIDS[@]})); then printf '%s\n' "${PIDS[@]}" | write_file cluster.pids; else rm -f "$DIR/cluster.pids"; fi; }
assign() {  # assign NAME VALUE: a line a shell sources back to VALUE
  if [[ $2 =~ ^[A-Za-z0-9_.,:/@+=-]*$ ]]; then echo "$1=$2"; else printf '%s=%q\n' "$1" "$2"; fi
}
write_env() {
  { assign MEMNODES "$MEMNODES"; assign PROVIDER "$PROVIDER"; assign TOKEN_FILE "$TOKEN_FILE"
    assign CLUSTER_DIR "$DIR"; assign CLUSTER_BIN "$BIN"
    if [[ -n $SERVE ]]; then assign SERVE "$SERVE"; fi; } | write_file cluster.env
}
read_pids() { PIDS=(); if [[ -f $DIR/cluster.pids ]]; then mapfile -t PIDS <"$DIR/cluster.pids"; fi; }
pid_of() { local f; read -ra f <<<"$1"; if [[ ${f[0]} == memnode ]]; then echo "${f[3]}"; else echo "${f[2]}"; fi; }

# fail MESSAGE [LOG]: the log's tail, then stop what this run started and forget it.
fail() {
  local line keep=()
  echo "$me: $1" >&2
  if [[ -n ${2:-} && -f $2 ]]; then echo "--- last lines of $2:" >&2; tail -n 20 "$2" >&2; fi
  if ((${#STARTED[@]})); then
    kill -TERM "${STARTED[@]}" 2>/dev/null || true  # our own children, not reaped: these pids are theirs
    stop "${STARTED[@]}"
    for line in "${PIDS[@]}"; do [[ " ${STARTED[*]} " == *" $(pid_of "$line") "* ]] || keep+=("$line"); done
    PIDS=("${keep[@]}")
    write_pids
    if ((${#PIDS[@]} == 0)); then rm -f "$DIR/cluster.env" "$DIR"/*.addr; fi
    [[ " ${PIDS[*]} " == *" serve "* ]] || rm -f "$DIR/serve.addr"
  fi
  exit 1
}

# wait_ready FILE PID SECONDS NAME LOG: until FILE is non-empty, while PID runs.
wait_ready() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    [[ -s $1 ]] && return 0
    running "$2" || fail "$4 exited before it was ready (log: $5)" "$5"
    sleep 0.1
  done
  [[ -s $1 ]] || fail "$4 not ready within $3 s (log: $5)" "$5"
}

# probe: a computenode without a subcommand prints every memnode's region header. It takes
# cn id 63 (no presence slot, clear of real computenodes) and the index's mode (shine, else
# dhnsw). A failure is tried once more: a computenode slow to open its fabric on a loaded host
# misses a memnode's 3 s hello deadline.
probe() {
  local mode rc try
  for try in 1 2; do
    for mode in shine dhnsw; do
      rc=0
      PROBE=$(timeout 30 "$BIN/computenode" --mode "$mode" --provider "$PROVIDER" "${TOKARGS[@]}" --cn-id 63 \
        --num-cns 64 --memnodes "$MEMNODES" 2>&1) || rc=$?
      [[ $rc -ne 0 && $PROBE == *"mode mismatch"* ]] || break
    done
    if ((rc == 0)); then return 0; fi
    if ((try == 1)); then sleep 1; fi
  done
  return "$rc"
}
headers() { grep -E '^memnode [0-9]+: region' <<<"$PROBE" || true; }

# start_serve MODE EXTRA...: computenode serve in the background, waited for (DIR/serve.addr).
start_serve() {
  local mode=$1 pid
  shift
  rm -f "$DIR/serve.addr"
  "$BIN/computenode" --mode "$mode" --provider "$PROVIDER" "${TOKARGS[@]}" --memnodes "$MEMNODES" \
    serve --listen "$LISTEN" --ready-file "$DIR/serve.addr" "$@" </dev/null >"$DIR/serve.log" 2>&1 &
  pid=$!
  STARTED+=("$pid") PIDS+=("serve $mode $pid -")
  write_pids
  wait_ready "$DIR/serve.addr" "$pid" 60 "serve ($mode)" "$DIR/serve.log"
  SERVE=$(head -n 1 "$DIR/serve.addr")
  PIDS[${#PIDS[@]} - 1]="serve $mode $pid $SERVE"
  write_pids
  write_env
}

need_bin() {
  BIN=${BIN:-${CLUSTER_BIN:-$(dirname "$0")/../build/bin}}
  [[ -x $BIN/memnode && -x $BIN/computenode ]] || die "no memnode and computenode in $BIN (build first: CONTRIBUTING.md)"
  BIN=$(cd "$BIN" && pwd)
}
load_env() {  # the cluster of DIR, or exit with CODE
  [[ -f $DIR/cluster.pids ]] || { say "no cluster in $DIR"; exit "$1"; }
  if [[ -f $DIR/cluster.env ]]; then
    # shellcheck disable=SC1091  # written by write_env
    source "$DIR/cluster.env"
  fi
  if [[ -n $TOKEN_FILE ]]; then TOKARGS=(--token-file "$TOKEN_FILE"); fi
  read_pids
}

cmd_up() {
  local line live=() i c pid addr f
  [[ $N =~ ^[1-9][0-9]*$ && $R =~ ^[1-9][0-9]*$ ]] || die "--memnodes and --replicas take a positive number"
  [[ $PROVIDER =~ ^(shm|tcp|cxl)$ ]] || die "--provider $PROVIDER: shm, tcp or cxl"
  [[ -z $SERVE_MODE || $SERVE_MODE =~ ^(shine|dhnsw)$ ]] || die "--serve $SERVE_MODE: shine or dhnsw"
  need_bin
  if [[ -n $LOAD ]]; then
    LOAD=$(cd "$LOAD" && pwd) || die "--load $LOAD: no such directory"
    for ((i = 0; i < N; i++)); do [[ -f $LOAD/memnode-$i.img ]] || die "--load: no $LOAD/memnode-$i.img"; done
  fi
  read_pids
  for line in "${PIDS[@]}"; do if ours "$(pid_of "$line")"; then live+=("$(pid_of "$line")"); fi; done
  ((${#live[@]} == 0)) || die "$DIR already runs a cluster (pids ${live[*]}): \`$0 down --dir $DIR\` first" 1
  if ((${#PIDS[@]})); then say "removing the stale cluster.pids of $DIR (none of its processes runs)"; fi
  PIDS=()
  rm -f "$DIR/cluster.pids" "$DIR/cluster.env" "$DIR"/*.addr
  mkdir -p "$DIR/images"
  if ((TOKEN)) || [[ $PROVIDER == tcp ]]; then
    TOKEN_FILE=$DIR/cluster.token
    if [[ ! -s $TOKEN_FILE ]]; then
      (umask 077 && head -c 32 /dev/urandom | base64 >"$DIR/.cluster.token.tmp")
      chmod 600 "$DIR/.cluster.token.tmp"
      mv -f "$DIR/.cluster.token.tmp" "$TOKEN_FILE"
    fi
    TOKARGS=(--token-file "$TOKEN_FILE")
  fi
  trap 'fail "interrupted"' INT TERM
  for ((i = 0; i < N; i++)); do
    for ((c = 0; c < R; c++)); do
      "$BIN/memnode" --id "$i" --replicas "$R" --copy "$c" --provider "$PROVIDER" --listen 127.0.0.1:0 \
        --region "$REGION" --ready-file "$DIR/mn$i.$c.addr" --store-dir "$DIR/images" "${TOKARGS[@]}" \
        ${LOAD:+--load "$LOAD/memnode-$i.img"} </dev/null >"$DIR/mn$i.$c.log" 2>&1 &
      STARTED+=("$!") PIDS+=("memnode $i $c $! -")
    done
  done
  write_pids
  MEMNODES=""
  for ((i = 0; i < N * R; i++)); do  # copy C of memnode I is physical memnode I*R+C: list them in that order
    read -r _ _ c pid _ <<<"${PIDS[i]}"
    wait_ready "$DIR/mn$((i / R)).$c.addr" "$pid" 30 "memnode $((i / R)) copy $c" "$DIR/mn$((i / R)).$c.log"
    addr=$(head -n 1 "$DIR/mn$((i / R)).$c.addr")
    PIDS[i]="memnode $((i / R)) $c $pid $addr"
    MEMNODES+=${MEMNODES:+,}$addr
  done
  write_pids
  probe || fail "the memnodes do not answer a computenode (exit $?):"$'\n'"$PROBE"
  (($(headers | wc -l) >= N)) || fail "the computenode printed no header for some memnode:"$'\n'"$PROBE"
  write_env
  if [[ -n $SERVE_MODE ]]; then start_serve "$SERVE_MODE"; fi
  trap - INT TERM
  say "cluster in $DIR: $N memnode id(s) x $R replica(s) over $PROVIDER, $REGION each"
  for line in "${PIDS[@]}"; do
    read -ra f <<<"$line"
    if [[ ${f[0]} == memnode ]]; then echo "  memnode ${f[1]} copy ${f[2]}  ${f[4]}  pid ${f[3]}"
    else echo "  serve ${f[1]}  ${f[3]}  pid ${f[2]}  (gRPC)"; fi
  done
  echo "Use it (logs in $DIR; stop it with: $0 down --dir $DIR):"
  echo "  source $DIR/cluster.env"
  echo "  $BIN/computenode --provider \$PROVIDER${TOKEN_FILE:+ --token-file \$TOKEN_FILE} --memnodes \$MEMNODES --mode shine build --data base.fvecs"
}

cmd_serve() {
  local line keep=()
  [[ $SERVE_MODE =~ ^(shine|dhnsw)$ ]] || die "serve MODE: shine or dhnsw"
  load_env 2
  need_bin
  for line in "${PIDS[@]}"; do
    if [[ $line == serve* ]]; then
      if ours "$(pid_of "$line")"; then die "$DIR already has a serve running: $line" 1; fi
    else keep+=("$line"); fi
  done
  PIDS=("${keep[@]}") SERVE=""
  write_pids
  write_env
  start_serve "$SERVE_MODE" "${EXTRA[@]}"
  say "serving $SERVE_MODE on $SERVE (log: $DIR/serve.log); SERVE=$SERVE in $DIR/cluster.env"
}

cmd_status() {
  local line pid state all=0 mn_up=0 f
  load_env 2
  for line in "${PIDS[@]}"; do
    pid=$(pid_of "$line")
    if ours "$pid"; then state=alive; else state=dead all=1; fi
    read -ra f <<<"$line"
    if [[ ${f[0]} == memnode ]]; then
      echo "memnode ${f[1]} copy ${f[2]}  ${f[4]}  pid $pid  $state"
      if [[ $state == alive ]]; then mn_up=1; fi
    else echo "serve ${f[1]}  ${f[3]}  pid $pid  $state"; fi
  done
  if ((mn_up)) && [[ -n $MEMNODES ]]; then
    need_bin
    if probe; then headers; else echo "the computenode could not read the region headers:"; echo "$PROBE"; all=1; fi
  fi
  exit "$all"
}

cmd_down() {
  local line serves=() mns=()
  [[ -f $DIR/cluster.pids ]] || { say "no cluster in $DIR: nothing to stop"; return 0; }
  read_pids
  for line in "${PIDS[@]}"; do
    if [[ $line == serve* ]]; then serves+=("$(pid_of "$line")"); else mns+=("$(pid_of "$line")"); fi
  done
  if ((${#serves[@]})); then stop "${serves[@]}"; fi
  if ((${#mns[@]})); then stop "${mns[@]}"; fi
  rm -f "$DIR/cluster.pids" "$DIR/cluster.env" "$DIR"/*.addr
  say "stopped the cluster in $DIR (${#PIDS[@]} process(es); logs, images and token kept)"
}

[[ $# -gt 0 ]] || die "a command: up, serve, status or down (see --help)"
CMD=$1
shift
case $CMD in
  -h|--help|help) usage ;;
  up|status|down) ;;
  serve)
    if [[ ${1:-} == -h || ${1:-} == --help ]]; then usage; fi
    [[ $# -gt 0 && $1 != -* ]] || die "serve MODE: shine or dhnsw"
    SERVE_MODE=$1
    shift ;;
  *) die "unknown command $CMD (see --help)" ;;
esac
while [[ $# -gt 0 ]]; do
  opt=$1
  shift
  case $CMD:$opt in
    *:-h|*:--help) usage ;;
    up:--token) TOKEN=1; continue ;;
    serve:--) EXTRA=("$@"); break ;;
  esac
  [[ $# -gt 0 ]] || die "$CMD: $opt is unknown or lacks its value (see --help)"
  case $CMD:$opt in
    *:--dir) DIR=$1 ;;
    up:--memnodes) N=$1 ;;
    up:--replicas) R=$1 ;;
    up:--region) REGION=$1 ;;
    up:--provider) PROVIDER=$1 ;;
    up:--load) LOAD=$1 ;;
    up:--serve) SERVE_MODE=$1 ;;
    up:--serve-listen|serve:--serve-listen|serve:--listen) LISTEN=$1 ;;
    up:--bin|serve:--bin|status:--bin) BIN=$1 ;;
    *) die "$CMD: unknown argument $opt (see --help)" ;;
  esac
  shift
done
if [[ $CMD == up ]]; then mkdir -p "$DIR"; fi
if [[ -d $DIR ]]; then DIR=$(cd "$DIR" && pwd); fi
"cmd_$CMD"
