#!/usr/bin/env bash
# Streamed decode and prefill, before / after the expert sets, alternating binaries:
#   ab_stream.sh OLD_SLUICE NEW_SLUICE ROUNDS MODELS_DIR PROMPTS_DIR
# MODELS_DIR holds q4x8l-Q2_0.gguf (sluice synth --preset qwen4exp-flash-next-8l --type Q2_0)
# and q35.gguf (--preset qwen35moe-35b-a3b --type Q4_K_M); PROMPTS_DIR is
# bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts. Prints one line a run: the test,
# the binary, then sluice bench's prefill t/s, decode t/s, TPOT p50/p95/p99, hit/miss, logits hash.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=$3 M=$4 P=$5
run() { # label binary args...
  local label=$1 bin=$2; shift 2
  printf '%-34s %-3s ' "$label" "$([ "$bin" = "$OLD" ] && echo old || echo new)"
  "$bin" bench "$@" -r 1 -t 2 2>&1 | tail -1 | awk -F'|' '{print $6 "|" $8 "|" $9 "|" $11 "|" $12}'
}
for r in $(seq "$ROUNDS"); do
  for b in "$OLD" "$NEW"; do
    run "q4x8l decode, cache 2G" "$b" -m "$M/q4x8l-Q2_0.gguf" --stream --cache 2G --prompt-file "$P/p1.txt" -p 48 -n 128
    run "q4x8l decode, cache floor 81x" "$b" -m "$M/q4x8l-Q2_0.gguf" --stream --cache 81x --prompt-file "$P/long4k.txt" -p 48 -n 64
    run "35B-A3B decode, cache 6G" "$b" -m "$M/q35.gguf" --stream --cache 6G -p 16 -n 64
    run "q4x8l pp512, cache 10G" "$b" -m "$M/q4x8l-Q2_0.gguf" --stream --cache 10G --prompt-file "$P/long4k.txt" -p 512 -n 0
  done
done
