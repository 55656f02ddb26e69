# shellcheck shell=bash
# Sourced by tools/cluster.sh and tools/slurm-local.sh: processes stopped by pid, never by name.
# The sourcing script defines `ours PID` (the pid is still one of the processes it started, so a
# reused pid is never signalled) and `say MESSAGE`.

# running PID: the process exists and is no zombie.
running() {
  local s
  [[ $1 =~ ^[0-9]+$ ]] && s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s%% *} != Z ]]
}

# stop PID...: SIGTERM to each of ours, then up to 10 s each before SIGKILL.
stop() {
  local pid t
  for pid in "$@"; do if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi; done
  for pid in "$@"; do
    for ((t = 0; t < 100; t++)); do ours "$pid" || continue 2; sleep 0.1; done
    say "pid $pid did not stop within 10 s after SIGTERM: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  done
}
