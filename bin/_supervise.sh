#!/usr/bin/env bash
# Sourced by bin/dev and bin/prod: start long-running children and stop all of them together.
#   spawn NAME CMD...   start CMD in its own process group
#   supervise           wait until a child exits or SIGTERM/SIGINT arrives, then stop every
#                       group (SIGTERM, SIGKILL after $GRACE seconds); returns the exit status
# Callers set GRACE (seconds) and define log().

# Job control: each child gets its own process group (its id = the child's pid), which its code
# server and run workers join, so one signal per group reaches the whole tree. Not `exec`: a
# webserver or daemon stopped alone would leave its code server running until its heartbeat
# times out.
set -m
groups=()
names=()
spawn() {
  local name="$1"
  shift
  "$@" &
  groups+=("$!")
  names+=("$name (pid $!)")
}

# Every process started below our children, whatever group it put itself in (a code server
# may leave its parent's group; it must not outlive us).
descendants() {
  local table
  table="$(ps -e -o pid=,ppid=)"
  local -a todo=("$@") found=()
  while [ "${#todo[@]}" -gt 0 ]; do
    local p="${todo[0]}"
    todo=("${todo[@]:1}")
    local kids
    kids="$(awk -v p="$p" '$2 == p { print $1 }' <<<"$table")"
    for k in $kids; do found+=("$k"); todo+=("$k"); done
  done
  echo "${found[@]:-}"
}

alive() {
  local g p
  for g in "${groups[@]}"; do kill -0 -- "-$g" 2>/dev/null && return 0; done
  for p in $tree; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
tree=""

stopping=0
stop() {
  [ "$stopping" = 1 ] && return
  stopping=1
  trap '' TERM INT
  local g p
  log "stopping (SIGTERM; SIGKILL after ${GRACE}s)"
  tree="$(descendants "${groups[@]}")"
  # Run workers interrupted here stop their runs; their keys resume in the next run.
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for p in $tree; do kill -TERM "$p" 2>/dev/null || true; done
  local deadline=$((SECONDS + GRACE))
  while alive && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  for p in $tree; do kill -KILL "$p" 2>/dev/null || true; done
  wait || true
  log "stopped"
}

trap 'stop; exit 143' TERM
trap 'stop; exit 130' INT

supervise() {
  local rc=0
  wait -n || rc=$?
  log "a process exited (status $rc); stopping"
  stop
  return "$rc"
}
