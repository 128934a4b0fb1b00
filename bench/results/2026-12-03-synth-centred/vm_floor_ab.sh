#!/usr/bin/env bash
# One floor run on the development VM and a replay of its decode reads right after (fio,
# bench/stream/io_ceiling.sh, depth 128), from the repository root:
#   M=MODELS/q4x8l-Q2_0.gguf BIN=path/to/ngram_stall vm_floor_ab.sh LABEL [VAR=VALUE ...]
# prints LABEL, the run's CPU time, its decode time, the replay's time and their ratio, and the
# decode's expert counters. SCRATCH (default WORK/ab) holds the run's output and read log.
set -u
P=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/long4k.txt
M=${M:?the centred qwen4exp-8l Q2_0 file}
BIN=${BIN:?ngram_stall binary}
S=${SCRATCH:-WORK/ab}; mkdir -p "$S"
label=$1; shift
sync; echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "cpu user %U sys %S" -o "$S/$label.time" env "$@" SLUICE_IO_LOG="$S/$label.iolog" \
  "$BIN" "$M" "$P" 48 64 512 2 stream forced 81 > "$S/$label.out" 2>&1
pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' "$S/$label.out")
pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' "$S/$label.out")
dec=$(grep -o "decode 64 tokens [0-9.]* s" "$S/$label.out" | awk '{print $4}')
rep=$(bash bench/stream/io_ceiling.sh "$S/$label.iolog" --skip-bytes $((pe + pn)) --depth 128 | awk '/depth/{print $6}')
ex=$(grep "^decode experts" "$S/$label.out" | grep -o "bytes [0-9]*\|io_wait_s [0-9.]*\|prefetch [0-9/]*" | tr '\n' ' ')
echo "$label $(cat "$S/$label.time") decode $dec s replay $rep s ratio $(awk -v a="$rep" -v b="$dec" 'BEGIN{printf "%.0f%%", 100*a/b}') $ex"
rm -f "$S/$label.iolog"
