#!/usr/bin/env bash
# As run.sh: the floor run at 16, 12 and 4 threads with io_uring, and at 16 with the pread pool
# (SLUICE_IO_BACKEND=pread), two rounds, no replays: does the compute threads' number change
# the decode's read time?
#   OUT=$OUT bash bench/results/2026-12-03-h200-cpu-stream/run_threads.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
[ -f "$M" ] || synth_model
for r in 1 2; do
  for cfg in "16 uring" "16 pread" "12 uring" "4 uring"; do
    set -- $cfg
    drop
    echo "== threads $1, $2, round $r"
    if [ "$2" = pread ]; then export SLUICE_IO_BACKEND=pread; else unset SLUICE_IO_BACKEND; fi
    timeout 150 "$C/ngram_stall" "$M" "$P" 48 64 512 "$1" stream forced 81 2>&1 | grep -E "^prefill [0-9]|^decode experts"
  done
done | tee "$OUT/threads.txt"
