#!/usr/bin/env bash
# Issue 10's floor run (qwen4exp-8l Q2_0, teacher-forced decode, expert cache at its floor of 81
# slots, so every step reads ~112 MB of experts) on the H200 machine's CPU cores, where compute is
# several times faster than on the 2-vCPU VM: the streamed decode against a replay of its own
# reads (iolog_replay, direct I/O into 2 MiB pages: the machine has no fio) and against the
# resident decode of the same tokens. No cgroup (the 81-slot cache bounds the run's memory).
# In CPU_ARCHIVE (setup.sh): sluice and ngram_stall (CPU build of this commit), iolog_replay,
# lib/ (liburing, libjansson, libmicrohttpd, libpcre2). Run from the repository root:
#   OUT=$OUT bash bench/results/2026-12-03-h200-cpu-stream/run.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
{ date -u; nproc; lscpu | grep -E "Model name|Socket|NUMA node\(s\)|Thread"; grep -o -w -E "avx512f|avx512_vnni|avx512_bf16|amx_tile" /proc/cpuinfo | sort | uniq -c
  free -g; df -h "$W"; lsblk -o NAME,ROTA,SIZE,MODEL,TYPE; uname -r; cat /sys/kernel/mm/transparent_hugepage/enabled
  "$C/sluice" --version; } > "$OUT/env.txt" 2>&1
synth_model
for t in ${THREADS:-16 8}; do
  for run in 1 2; do
    N=f81-t$t-r$run
    drop
    SLUICE_IO_LOG=$OUT/$N.iolog timeout 150 "$C/ngram_stall" "$M" "$P" 48 64 512 "$t" stream forced 81 > "$OUT/$N.out" 2>&1
    echo "rc=$?" >> "$OUT/$N.out"
    pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' "$OUT/$N.out")
    pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' "$OUT/$N.out")
    for d in 32 128; do drop; timeout 60 "$C/iolog_replay" "$OUT/$N.iolog" $d $(( ${pe:-0} + ${pn:-0} )); done > "$OUT/$N.replay" 2>&1
    xz -T4 "$OUT/$N.iolog" 2>/dev/null
  done
  timeout 150 "$C/ngram_stall" "$M" "$P" 48 64 512 "$t" resident forced > "$OUT/res-t$t.out" 2>&1
  echo "rc=$?" >> "$OUT/res-t$t.out"
done
# one file back (a call returns a few files): everything but the logs
for f in "$OUT"/env.txt "$OUT"/synth.txt "$OUT"/*.out "$OUT"/*.replay; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/env.txt "$OUT"/synth.txt
grep -E "^== |^prefill [0-9]|^decode experts|^depth|rc=|synth" "$OUT/all.txt"
