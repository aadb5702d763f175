#!/usr/bin/env bash
# A queue of long jobs on the H200 machine, spread over `run` calls (each call <= 600 s; a warm machine keeps
# /tmp and its detached processes only 30 s between calls). Run from the repository root after
# `source gpu/stage.sh .gpu34` (the queue inherits the environment it exports):
#
#   SDLIB_GIT_COMMIT=<sha> bash gpu/session.sh start gpu/queue_h200.txt [MODELS_TAR]
#       copies the checkout to /tmp/sdrepo (a later call's checkout copy cannot change a running job's files),
#       unpacks MODELS_TAR there if given (the sparse checkout's data/models, carried once), and starts the
#       queue detached (setsid): every job runs in /tmp/sdrepo, one after another, under its own timeout
#   bash gpu/session.sh wait SECONDS [JOB]
#       waits until the queue has ended or SECONDS have passed (or, with JOB, until that job of the queue has
#       ended, so a call can return when a part ends rather than hold the machine into one that cannot finish),
#       prints each job's state, and packs /tmp/res (every job's results folder) and the logs into $OUT (split
#       into 15 MiB files)
#   bash gpu/session.sh stop
#       ends the queue and every process it started: the runner, the running job's process group (`timeout`
#       leads a group of its own, so killing the runner's group alone left the job running) and any process
#       still working in /tmp/sdrepo (a sweep's workers run in sessions of their own), TERM first, KILL after
#       STOP_GRACE_S (default 20) seconds; it lists what it had to KILL
#
# Queue file: one job a line, `name<TAB>timeout_s<TAB>command` (# comments). A job's command sees
# RES=/tmp/res (pass it as --results-dir), JOB_OUT=/tmp/sdsess/<name> and OUT=$JOB_OUT. A job that fails or
# times out is recorded and the queue goes on. State: /tmp/sdsess/status (`name rc seconds` per ended job).
set -u
# The folders (overridable for tests only: SDLIB_SESSION_ROOT puts all three under one folder)
SESS=${SDLIB_SESSION_ROOT:-/tmp}/sdsess REPO=${SDLIB_SESSION_ROOT:-/tmp}/sdrepo RES=${SDLIB_SESSION_ROOT:-/tmp}/res
cmd=${1:?usage: session.sh start QUEUE [MODELS_TAR] | wait SECONDS [JOB] | stop}

_run_queue() {  # detached: the jobs of $1, in order
  local queue=$1 name limit command t0 rc
  while IFS=$'\t' read -r name limit command; do
    case "$name" in \#*|"") continue;; esac
    mkdir -p "$SESS/$name"
    echo "$name" > "$SESS/current"
    t0=$(date +%s)
    echo "[$(date -u +%T)] start $name (limit ${limit}s): $command" >> "$SESS/queue.log"
    ( cd "$REPO" && RES=$RES JOB_OUT=$SESS/$name OUT=$SESS/$name exec timeout -k 20 "$limit" bash -c "$command" ) \
      > "$SESS/$name/log.txt" 2>&1 &
    echo $! > "$SESS/job.pid"  # timeout's pid, which leads the job's process group
    wait $!
    rc=$?
    echo "$name $rc $(( $(date +%s) - t0 ))" >> "$SESS/status"
    echo "[$(date -u +%T)] end $name rc=$rc after $(( $(date +%s) - t0 ))s" >> "$SESS/queue.log"
  done < "$queue"
  rm -f "$SESS/current"
  echo done > "$SESS/ended"
}

_leftovers() {  # pids in the runner's or the job's process group ($1, $2), or working in $REPO; not this shell's
  # ($3 = outside: only those working in $REPO outside the two groups, i.e. not yet sent a SIGTERM)
  local p g cwd
  ps -eo pid=,pgid= | while read -r p g; do
    [ "$p" = "$$" ] && continue
    if [ "$g" = "${1:-x}" ] || [ "$g" = "${2:-x}" ]; then [ "${3:-}" = outside ] || echo "$p"; continue; fi
    cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || continue
    case "$cwd" in "$REPO"|"$REPO"/*) echo "$p";; esac
  done | tr '\n' ' ' | sed 's/ $//'
}

_pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  cp -f "$SESS/queue.log" "$SESS/status" "$OUT/" 2>/dev/null
  tar czf "$SESS/logs.tgz" -C "$SESS" --exclude=logs.tgz --exclude=res.tgz . 2>/dev/null; cp "$SESS/logs.tgz" "$OUT/"
  if [ -d "$RES" ]; then
    # A running job adds files while tar reads: GNU tar then says "file changed as we read it" and exits 1, with
    # the archive whole (result files are written to a temporary name and renamed, so none is half-written; the
    # temporary ones, ".NAME.XXXXXXXX", are left out: `*` must not match "/", or "a.json.gz" would be too). Only a
    # fatal error (2) loses the results; say so.
    tar czf "$SESS/res.tgz" -C "$RES" --no-wildcards-match-slash --exclude='.*.parquet.*' --exclude='.*.json.*' .
    local rc=$?
    if [ "$rc" -le 1 ]; then
      split -b 15M -d "$SESS/res.tgz" "$OUT/res.tgz.part"
    else
      echo "session: results not packed (tar exit $rc); call wait again to pack them"
    fi
    ls -l "$OUT"
  fi
}

case "$cmd" in
  start)
    queue=${2:?queue file}; models=${3:-}
    [ -f "$queue" ] || { echo "session: no queue file $queue"; exit 2; }
    [ -n "${SDLIB_GIT_COMMIT:-}" ] || { echo "session: set SDLIB_GIT_COMMIT to the commit of this checkout"; exit 2; }
    [ -n "${SDLIB_GPU_STACK:-}" ] || { echo "session: source gpu/stage.sh first"; exit 2; }
    if [ -f "$SESS/pid" ] && kill -0 "$(cat "$SESS/pid")" 2>/dev/null; then echo "session: a queue is running"; exit 2; fi
    rm -rf "$SESS" "$REPO"; mkdir -p "$SESS" "$RES"
    mkdir -p "$REPO" && tar -c --exclude=./.gpu34 --exclude=./.gpu --exclude=./.gpumodels --exclude=./.gpucache . | tar -x -C "$REPO" || exit 1
    if [ -n "$models" ]; then tar xf "$models" -C "$REPO" || { echo "session: cannot unpack $models"; exit 1; }; fi
    cp "$queue" "$SESS/queue.txt"
    export SDLIB_GIT_COMMIT
    _pp=${PYTHONPATH:-}; export PYTHONPATH="${_pp//$PWD/$REPO}"
    setsid nohup bash "$REPO/gpu/session.sh" _queue "$SESS/queue.txt" > "$SESS/runner.log" 2>&1 < /dev/null &
    echo $! > "$SESS/pid"
    echo "session: queue started (pid $(cat "$SESS/pid"), $(grep -cv '^#' "$queue") jobs, commit $SDLIB_GIT_COMMIT)"
    ;;
  _queue) _run_queue "$2" ;;
  wait)
    limit=${2:?seconds}; job=${3:-}; t0=$(date +%s)
    case "$limit" in ''|*[!0-9]*) echo "session: wait takes whole seconds, not '$limit'"; exit 2;; esac
    if [ -n "$job" ] && ! grep -v '^#' "$SESS/queue.txt" 2>/dev/null | cut -f1 | grep -qxF -- "$job"; then
      echo "session: no job '$job' in the running queue ($SESS/queue.txt)"; exit 2
    fi
    # a status line is `name rc seconds`; the name may hold spaces, so strip the last two fields
    _job_ended() { [ -n "$job" ] && sed -E 's/ -?[0-9]+ [0-9]+$//' "$SESS/status" 2>/dev/null | grep -qxF -- "$job"; }
    while [ ! -f "$SESS/ended" ] && ! _job_ended && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      kill -0 "$(cat "$SESS/pid" 2>/dev/null)" 2>/dev/null || break; sleep 5
    done
    if [ -n "$job" ]; then echo "session: job $job $(_job_ended && echo ended || echo 'not ended')"; fi
    echo "session: $( [ -f "$SESS/ended" ] && echo ended || echo "running $(cat "$SESS/current" 2>/dev/null)")"
    cat "$SESS/status" 2>/dev/null
    tail -5 "$SESS/$(cat "$SESS/current" 2>/dev/null || echo none)/log.txt" 2>/dev/null
    _pack
    ;;
  stop)
    pid=$(cat "$SESS/pid" 2>/dev/null) && kill -- -"$pid" 2>/dev/null  # the runner first: it starts no next job
    jpid=$(cat "$SESS/job.pid" 2>/dev/null) && kill -- -"$jpid" 2>/dev/null
    grace=${STOP_GRACE_S:-20}; t0=$(date +%s)
    sleep 1; left=$(_leftovers "$pid" "$jpid" outside); [ -n "$left" ] && kill $left 2>/dev/null  # e.g. workers
    while [ -n "$(_leftovers "$pid" "$jpid")" ] && [ $(( $(date +%s) - t0 )) -lt "$grace" ]; do sleep 1; done
    left=$(_leftovers "$pid" "$jpid")
    if [ -n "$left" ]; then
      echo "session: killing what outlived ${grace}s of SIGTERM:"; ps -ww -o pid,args -p "${left// /,}" 2>/dev/null
      kill -9 $left 2>/dev/null
    fi
    echo "session: stopped"; _pack
    ;;
  *) echo "session: unknown command $cmd"; exit 2 ;;
esac
