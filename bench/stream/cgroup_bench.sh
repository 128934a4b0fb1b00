#!/usr/bin/env bash
# Streamed run of a model inside a memory cgroup (v1 here; v2 where mounted), beside llama.cpp
# in the same limit. Needs root (creates /sys/fs/cgroup/memory/NAME).
#
#   bench/stream/cgroup_bench.sh MODEL.gguf LIMIT OUTDIR [sluice bench args...]
#
# Writes OUTDIR/{machine.txt,fio.txt,sluice.json,sluice.md,plan.txt,llama.txt,cgroup.txt}.
# LLAMA_BENCH (optional) runs llama-bench in the same cgroup with all weights in the plain CPU
# buffer (no repacking, mmap paging), LLAMA_ARGS its arguments.
set -euo pipefail
MODEL=$1 LIMIT=$2 OUT=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SLUICE=${SLUICE:-$ROOT/build/sluice}
CG=/sys/fs/cgroup/memory/sluice-bench
mkdir -p "$OUT" "$CG"
echo "$LIMIT" >"$CG/memory.limit_in_bytes"
in_cgroup() { (echo $BASHPID >"$CG/cgroup.procs"; exec "$@"); }
{ date -u; uname -r; grep -m1 "model name" /proc/cpuinfo; nproc; grep -E "MemTotal|SwapTotal" /proc/meminfo
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"; "$SLUICE" --version; echo "cgroup limit: $(cat $CG/memory.limit_in_bytes)"; } >"$OUT/machine.txt"
# the disk: parallel direct random reads of expert-sized blocks, as the cache does
fio --name=experts --filename="$MODEL" --readonly --direct=1 --ioengine=io_uring --rw=randread \
    --bs=2M --iodepth=32 --runtime=15 --time_based --group_reporting >"$OUT/fio.txt" 2>&1
sync; echo 3 >/proc/sys/vm/drop_caches
echo 0 >"$CG/memory.max_usage_in_bytes" 2>/dev/null || true
in_cgroup "$SLUICE" bench -m "$MODEL" --plan >"$OUT/plan.txt" 2>&1 || true
in_cgroup "$SLUICE" bench -m "$MODEL" --json -o "$OUT/sluice.json" "$@" 2>"$OUT/sluice.err"
in_cgroup "$SLUICE" bench -m "$MODEL" -o "$OUT/sluice.md" --no-warmup -r 1 -p 1 -n 1 2>/dev/null || true
{ echo "max usage: $(cat $CG/memory.max_usage_in_bytes)"; echo "failcnt: $(cat $CG/memory.failcnt)";
  grep -E "oom_kill|under_oom" $CG/memory.oom_control; grep pswpout /proc/vmstat; } >"$OUT/cgroup.txt"
if [ -n "${LLAMA_BENCH:-}" ]; then
  sync; echo 3 >/proc/sys/vm/drop_caches
  echo 0 >"$CG/memory.max_usage_in_bytes" 2>/dev/null || true
  set +e
  in_cgroup timeout "${LLAMA_TIMEOUT:-1800}" "$LLAMA_BENCH" -m "$MODEL" ${LLAMA_ARGS:-} >"$OUT/llama.txt" 2>&1
  echo "exit status: $?" >>"$OUT/llama.txt"
  set -e
  { echo "llama.cpp max usage: $(cat $CG/memory.max_usage_in_bytes)";
    grep -E "oom_kill" $CG/memory.oom_control; } >>"$OUT/cgroup.txt"
fi
