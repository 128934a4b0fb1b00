#!/bin/sh
# Alternating rounds: binaries old (before 6dd8429) and new (6dd8429), plain / --mtp 2 / --mtp 2 --mtp-always.
P=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/p1.txt
M=MODELS/q4x8l-mtp-Q2_0.gguf
for i in 1 2 3 4; do
  for bin in old new; do
    for v in "" "--mtp 2" "--mtp 2 --mtp-always"; do
      printf 'round %s %s [%s] ' "$i" "$bin" "$v"
      build-$bin/sluice bench -m $M --resident --prompt-file $P -p 48 -n 128 -r 2 -t 2 $v 2>&1 | grep -E '^\| Qwen|MTP|bench: prompt' | tr '\n' ' '
      echo
    done
  done
done
