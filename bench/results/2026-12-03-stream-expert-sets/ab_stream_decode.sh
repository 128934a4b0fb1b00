#!/usr/bin/env bash
# Streamed decode before / after the expert sets, alternating binaries, ROUNDS rounds:
#   ab_stream_decode.sh OLD_SLUICE NEW_SLUICE ROUNDS MODELS_DIR PROMPTS_DIR  (as ab_stream.sh)
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=$3 M=$4 P=$5
run() { local label=$1 bin=$2; shift 2
  printf '%-34s %-3s ' "$label" "$([ "$bin" = "$OLD" ] && echo old || echo new)"
  "$bin" bench "$@" -r 1 -t 2 2>&1 | tail -1 | awk -F'|' '{print $6 "|" $8 "|" $9 "|" $11 "|" $12}'; }
for r in $(seq "$ROUNDS"); do for b in "$OLD" "$NEW"; do
    run "q4x8l decode, cache 2G" "$b" -m "$M/q4x8l-Q2_0.gguf" --stream --cache 2G --prompt-file "$P/p1.txt" -p 48 -n 128
    run "35B-A3B decode, cache 6G" "$b" -m "$M/q35.gguf" --stream --cache 6G -p 16 -n 64
done; done
