# Sourced from the repository root by the scripts of this directory and of
# ../2026-12-03-synth-centred: the binaries unpacked, the paths, drop(), synth_model and
# floor_run. CPU_ARCHIVE (default cpu.tar.xz in the repository root) is a tar.xz built on the
# development VM of: sluice and ngram_stall (CPU build of the commit the record names),
# iolog_replay (bench/stream/iolog_replay.c) and lib/ (liburing, libjansson, libmicrohttpd,
# libpcre2 of that VM), since the H200 machine has none of them installed.
# Scratch (the binaries, the model, the default output) lives under bench/tmp/ (gitignored).
OUT=${OUT:-$PWD/bench/tmp/h200-out}; mkdir -p "$OUT"
C=$PWD/bench/tmp/h200-cpu-bin; mkdir -p "$C" && tar xJf "${CPU_ARCHIVE:-cpu.tar.xz}" -C "$C"
export LD_LIBRARY_PATH=$C/lib
W=$PWD/bench/tmp/h200-models; mkdir -p "$W"
P=$PWD/bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/long4k.txt
M=$W/q4x8l-Q2_0.gguf
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "cannot drop the page cache" >&2; }
# qwen4exp-8l Q2_0 into $M (its vocabulary from tests/data), timed into $OUT/synth.txt
synth_model() {
  tar xJf tests/data/tokenizer-vocab.tar.xz -C "$W"
  local v s
  v=$(find "$W" -name ggml-vocab-qwen35.gguf | head -1)
  s=$(date +%s.%N)
  timeout 240 "$C/sluice" synth --preset qwen4exp-flash-next-8l --type Q2_0 --vocab "$v" -o "$M" -q -t 16 > "$OUT/synth.txt" 2>&1
  echo "synth rc=$? in $(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}') s" >> "$OUT/synth.txt"
  ls -la "$W" >> "$OUT/synth.txt"
}
# floor_run NAME BIN "DEPTHS" [VAR=VALUE ...]: the floor run ($M, 81 slots, $T threads, the
# variables set) with its reads logged, then replays of its decode reads (the prompt's skipped)
# at each depth; $OUT/NAME.out and $OUT/NAME.replay (bench/results/2026-12-03-synth-centred)
floor_run() {
  local n=$1 bin=$2 depths=$3 pe pn d
  shift 3
  drop
  env "$@" SLUICE_IO_LOG="$OUT/$n.iolog" timeout 150 "$C/$bin" "$M" "$P" 48 64 512 "$T" stream forced 81 > "$OUT/$n.out" 2>&1
  echo "rc=$?" >> "$OUT/$n.out"
  pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' "$OUT/$n.out")
  pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' "$OUT/$n.out")
  for d in $depths; do drop; timeout 60 "$C/iolog_replay" "$OUT/$n.iolog" "$d" $(( ${pe:-0} + ${pn:-0} )); done > "$OUT/$n.replay" 2>&1
  rm -f "$OUT/$n.iolog"
}
