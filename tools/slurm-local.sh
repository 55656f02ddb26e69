#!/usr/bin/env bash
# slurm-local.sh: a Slurm cluster on this one host, for tests and trials of deploy/slurm/.
#
#   tools/slurm-local.sh up [--dir DIR] [--nodes N] [--cpus C] [--timeout S]
#       writes DIR/slurm.conf (N node names, default 3, each its own slurmd on 127.0.0.1 with a port
#       of its own, C CPUs each, default 2; one partition `dmhnsw` with all of them), starts
#       slurmctld and one slurmd per node name (no systemd, no munge: auth/none), waits up to S
#       seconds (default 60) for `sinfo` to show every node idle, and prints how to use it.
#   tools/slurm-local.sh status [--dir DIR]    the daemons alive or dead, then sinfo and squeue
#                                              (exit 0: all alive, 1: not, 2: no cluster in DIR)
#   tools/slurm-local.sh down [--dir DIR]      cancels every job, stops the daemons by pid (SIGTERM,
#                                              SIGKILL after 10 s) and any slurmstepd they left
#   tools/slurm-local.sh env [--dir DIR]       prints `export SLURM_CONF=DIR/slurm.conf`
#
# Slurm's commands then find this cluster through SLURM_CONF:
#   export SLURM_CONF=$DIR/slurm.conf   # or: eval "$(tools/slurm-local.sh env --dir DIR)"
#   sinfo; sbatch --wait deploy/slurm/dmhnsw.sbatch
# DIR (default runs/slurm) holds slurm.conf, the state and spool directories, the daemons' logs
# (log/) and pids (daemons.pids: "NAME PID" lines). Needs root and Debian's slurmctld, slurmd and
# slurm-client (tools/install-deps.sh); exit 3 when they are missing. Heterogeneous jobs are
# scheduled by the backfill scheduler only: bf_interval=1 makes that every second (default 30).
# auth/none lets any local user act as any other: only for a test host.
set -euo pipefail

me=slurm-local.sh
DIR=runs/slurm NODES=3 CPUS=2 TIMEOUT=60
MARK=DMHNSW_SLURM_LOCAL  # in the daemons' environment, which their slurmstepd processes inherit

say() { echo "$me: $*"; }
usage() { sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }
die() { echo "$me: $1" >&2; exit "${2:-2}"; }
# shellcheck source=tools/pids.sh
source "$(dirname "${BASH_SOURCE[0]}")/pids.sh"  # running, stop

# ours PID: a running process that carries this cluster's mark in its environment (a daemon
# started by `up`, or a slurmstepd one of them forked): a reused pid is never signalled.
ours() {
  running "$1" && tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | grep -qxF "$MARK=$DIR"
}
marked_pids() {  # every process that carries the mark, but this script
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p != "$$" && $p != "$BASHPID" ]] && ours "$p" && echo "$p"
  done
  return 0
}

# free_port: a TCP port nobody listens on, from a random start in 20000..39999, not in $USED.
USED=" "
free_port() {
  local p=$((20000 + RANDOM % 20000)) i
  for ((i = 0; i < 2000; i++)); do
    if [[ $USED != *" $p "* ]] && [[ -z $(ss -Htln "sport = :$p" 2>/dev/null) ]]; then
      USED+="$p "
      echo "$p"
      return 0
    fi
    p=$((p + 1 > 39999 ? 20000 : p + 1))
  done
  die "no free TCP port found" 1
}

need_slurm() {
  local c miss=()
  for c in slurmctld slurmd sinfo squeue scancel sbatch srun scontrol; do
    command -v "$c" >/dev/null || miss+=("$c")
  done
  ((${#miss[@]} == 0)) || die "not installed: ${miss[*]} (Debian: slurmctld slurmd slurm-client; tools/install-deps.sh)" 3
  [[ $(id -u) -eq 0 ]] || die "needs root (slurmd starts jobs as their users)" 3
}

node_names() {  # dmh1 dmh2 ... dmhN
  local i out=""
  for ((i = 1; i <= NODES; i++)); do out+=${out:+ }dmh$i; done
  echo "$out"
}

write_conf() {
  local host ctl_port i names
  host=$(hostname -s)
  ctl_port=$(free_port)
  names=$(node_names)
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run"
  : >"$DIR/plugstack.conf"  # no site SPANK plugins (/etc/slurm/plugstack.conf)
  {
    echo "# Written by tools/slurm-local.sh: a one-host Slurm for tests (auth/none: a test host only)."
    echo "ClusterName=dmhnsw-local"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ctl_port"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/none"
    echo "CredType=cred/none"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "PlugStackConfig=$DIR/plugstack.conf"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "SchedulerType=sched/backfill"
    echo "SchedulerParameters=bf_interval=1"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    # the CPUs below whatever this host has: nodes are not drained for having fewer
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "KillWait=10"
    echo "InactiveLimit=0"
    echo "MinJobAge=300"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    for ((i = 1; i <= NODES; i++)); do
      echo "NodeName=dmh$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$CPUS RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=dmhnsw Nodes=${names// /,} Default=YES MaxTime=INFINITE State=UP"
  } >"$DIR/.slurm.conf.tmp"
  mv -f "$DIR/.slurm.conf.tmp" "$DIR/slurm.conf"
}

read_pids() { PIDS=(); if [[ -f $DIR/daemons.pids ]]; then mapfile -t PIDS <"$DIR/daemons.pids"; fi; }

# start NAME ARGV...: a daemon in the foreground mode (-D) in a session of its own, detached.
start() {
  local name=$1
  shift
  env "$MARK=$DIR" SLURM_CONF="$DIR/slurm.conf" setsid "$@" </dev/null >"$DIR/log/$name.out" 2>&1 &
  echo "$name $!" >>"$DIR/daemons.pids"
}

fail_up() {
  local f
  echo "$me: $1" >&2
  for f in "$DIR"/log/*.out "$DIR"/log/*.log; do
    [[ -s $f ]] || continue
    echo "--- last lines of $f:" >&2
    tail -n 15 "$f" >&2
  done
  cmd_down >&2 || true
  exit 1
}

cmd_up() {
  local line live=() n i out idle
  [[ $NODES =~ ^[1-9][0-9]*$ && $CPUS =~ ^[1-9][0-9]*$ && $TIMEOUT =~ ^[1-9][0-9]*$ ]] ||
    die "--nodes, --cpus and --timeout take a positive number"
  need_slurm
  read_pids
  for line in "${PIDS[@]}"; do if ours "${line#* }"; then live+=("$line"); fi; done
  ((${#live[@]} == 0)) || die "$DIR already runs a Slurm (${live[*]}): \`$0 down --dir $DIR\` first" 1
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/daemons.pids"
  mkdir -p "$DIR/log"
  rm -f "$DIR"/log/*
  write_conf
  export SLURM_CONF=$DIR/slurm.conf
  trap 'fail_up "interrupted"' INT TERM
  start slurmctld slurmctld -D -i -f "$DIR/slurm.conf"
  for n in $(node_names); do
    mkdir -p "$DIR/spool/$n"
    start "slurmd-$n" slurmd -D -N "$n" -f "$DIR/slurm.conf"
  done
  for ((i = 0; i < TIMEOUT * 2; i++)); do
    read_pids
    for line in "${PIDS[@]}"; do
      running "${line#* }" || fail_up "${line% *} (pid ${line#* }) exited (logs in $DIR/log)"
    done
    out=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
    idle=$(grep -c ' idle$' <<<"$out" || true)
    if ((idle == NODES)); then break; fi
    sleep 0.5
  done
  ((idle == NODES)) || fail_up "sinfo shows $idle of $NODES nodes idle after ${TIMEOUT} s:"$'\n'"$out"
  trap - INT TERM
  say "a one-host Slurm in $DIR: slurmctld and $NODES slurmd (nodes $(node_names)), $CPUS CPUs each, all idle"
  echo "Use it (stop it with: $0 down --dir $DIR):"
  echo "  export SLURM_CONF=$DIR/slurm.conf"
  echo "  sinfo"
}

cmd_status() {
  local line all=0
  [[ -f $DIR/daemons.pids ]] || { say "no Slurm in $DIR"; exit 2; }
  read_pids
  for line in "${PIDS[@]}"; do
    if ours "${line#* }"; then echo "${line% *}  pid ${line#* }  alive"; else echo "${line% *}  pid ${line#* }  dead"; all=1; fi
  done
  if ((all == 0)); then
    SLURM_CONF=$DIR/slurm.conf sinfo -N -o '%N %P %t %c' || all=1
    SLURM_CONF=$DIR/slurm.conf squeue || all=1
  fi
  exit "$all"
}


cmd_down() {
  local line jobs i ctl="" slurmds=() left
  [[ -f $DIR/daemons.pids ]] || { say "no Slurm in $DIR: nothing to stop"; return 0; }
  read_pids
  for line in "${PIDS[@]}"; do
    if [[ $line == slurmctld* ]]; then ctl=${line#* }; else slurmds+=("${line#* }"); fi
  done
  export SLURM_CONF=$DIR/slurm.conf
  if [[ -n $ctl ]] && ours "$ctl"; then
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      say "cancelling job(s) ${jobs//$'\n'/ }"
      # shellcheck disable=SC2086  # one job id a word
      timeout 10 scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 60; i++)); do
        [[ -z $(timeout 10 squeue -h -o %A 2>/dev/null || true) ]] && break
        sleep 0.5
      done
    fi
  fi
  if ((${#slurmds[@]})); then stop "${slurmds[@]}"; fi
  if [[ -n $ctl ]]; then stop "$ctl"; fi
  # slurmstepd processes of steps still running (their slurmd gone) carry the mark too
  mapfile -t left < <(marked_pids)
  if ((${#left[@]})); then
    say "stopping leftover process(es) ${left[*]}"
    stop "${left[@]}"
  fi
  rm -f "$DIR/daemons.pids"
  say "stopped the Slurm in $DIR (${#PIDS[@]} daemon(s); logs kept in $DIR/log)"
}

[[ $# -gt 0 ]] || die "a command: up, status, down or env (see --help)"
CMD=$1
shift
case $CMD in
  -h|--help|help) usage ;;
  up|status|down|env) ;;
  *) die "unknown command $CMD (see --help)" ;;
esac
while [[ $# -gt 0 ]]; do
  opt=$1
  shift
  case $opt in -h|--help) usage ;; esac
  [[ $# -gt 0 ]] || die "$CMD: $opt is unknown or lacks its value (see --help)"
  case $CMD:$opt in
    *:--dir) DIR=$1 ;;
    up:--nodes) NODES=$1 ;;
    up:--cpus) CPUS=$1 ;;
    up:--timeout) TIMEOUT=$1 ;;
    *) die "$CMD: unknown argument $opt (see --help)" ;;
  esac
  shift
done
if [[ $CMD == up ]]; then mkdir -p "$DIR"; fi
if [[ -d $DIR ]]; then DIR=$(cd "$DIR" && pwd); fi
case $CMD in
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  *) "cmd_$CMD" ;;
esac
