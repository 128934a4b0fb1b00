#!/usr/bin/env bash
# One cold run of the qwen4exp-8l streaming bench (issue 10), after bench/stream/cgroup_bench.sh:
# drop the page cache, fresh process, inside a v1 memory cgroup (own name, so it does not share
# the sluice-bench group with other engineers' runs). LIMIT "none" runs outside any cgroup and
# does not drop the page cache (the resident reference, file pre-read into the page cache).
#   run_one.sh NAME LIMIT OUTDIR PROGRAM ARGS...
set -euo pipefail
NAME=$1 LIMIT=$2 OUT=$3; shift 3
CG=/sys/fs/cgroup/memory/sluice-q4b
mkdir -p "$OUT"
log() { echo "$*" >>"$OUT/$NAME.meta"; }
: >"$OUT/$NAME.meta"
log "date: $(date -u +%FT%TZ)"
log "command: $*"
log "limit: $LIMIT"
log "uptime before: $(uptime)"
sw0=$(awk '/pswpout/{print $2}' /proc/vmstat)
if [ "$LIMIT" != none ]; then
  mkdir -p "$CG"; echo "$LIMIT" >"$CG/memory.limit_in_bytes"
  sync; echo 3 >/proc/sys/vm/drop_caches
  echo 0 >"$CG/memory.max_usage_in_bytes"; echo 0 >"$CG/memory.failcnt"
  oom0=$(awk '/oom_kill /{print $2}' "$CG/memory.oom_control")
  set +e
  (echo $BASHPID >"$CG/cgroup.procs"; exec /usr/bin/time -v "$@") >"$OUT/$NAME.out" 2>"$OUT/$NAME.err"
  rc=$?
  set -e
  log "cgroup limit: $(cat $CG/memory.limit_in_bytes)"
  log "cgroup max usage: $(cat $CG/memory.max_usage_in_bytes)"
  log "cgroup failcnt: $(cat $CG/memory.failcnt)"
  log "cgroup oom_kill during run: $(( $(awk '/oom_kill /{print $2}' $CG/memory.oom_control) - oom0 ))"
  log "cgroup page cache after (total_cache): $(awk '/^total_cache /{print $2}' $CG/memory.stat)"
else
  set +e
  /usr/bin/time -v "$@" >"$OUT/$NAME.out" 2>"$OUT/$NAME.err"
  rc=$?
  set -e
fi
log "exit status: $rc"
log "pswpout during run: $(( $(awk '/pswpout/{print $2}' /proc/vmstat) - sw0 ))"
log "uptime after: $(uptime)"
cat "$OUT/$NAME.meta"
