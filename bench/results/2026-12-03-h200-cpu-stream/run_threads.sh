#!/usr/bin/env bash
# As run.sh: the floor run at 16, 12 and 4 threads with io_uring, and at 16 with the pread pool
# (SLUICE_IO_BACKEND=pread), two rounds, no replays: does the compute threads' number change
# the decode's read time?
#   OUT=$OUT bash bench/results/2026-12-03-h200-cpu-stream/run_threads.sh
set -u
OUT=${OUT:-/tmp/h200-cpu}; mkdir -p "$OUT"
C=$PWD/.devcarry/cpu; mkdir -p "$C" && tar xJf .devcarry/cpu.tar.xz -C "$C"
export LD_LIBRARY_PATH=$C/lib
W=$PWD/work; mkdir -p "$W"
P=$PWD/bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/long4k.txt
M=$W/q4x8l-Q2_0.gguf
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "cannot drop the page cache" >&2; }
tar xJf tests/data/tokenizer-vocab.tar.xz -C "$W"
V=$(find "$W" -name ggml-vocab-qwen35.gguf | head -1)
[ -f "$M" ] || timeout 240 "$C/sluice" synth --preset qwen4exp-flash-next-8l --type Q2_0 --vocab "$V" -o "$M" -q -t 16 > "$OUT/synth.txt" 2>&1
for r in 1 2; do
  for cfg in "16 uring" "16 pread" "12 uring" "4 uring"; do
    set -- $cfg
    drop
    echo "== threads $1, $2, round $r"
    if [ "$2" = pread ]; then export SLUICE_IO_BACKEND=pread; else unset SLUICE_IO_BACKEND; fi
    timeout 150 "$C/ngram_stall" "$M" "$P" 48 64 512 "$1" stream forced 81 2>&1 | grep -E "^prefill [0-9]|^decode experts"
  done
done | tee "$OUT/threads.txt"
