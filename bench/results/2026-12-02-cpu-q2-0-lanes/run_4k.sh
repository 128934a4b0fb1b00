#!/bin/sh
# The seed's prefill protocol, resident: a 4,096-token prompt in 1K chunks; old/new binaries alternating.
PR=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
M=MODELS/q4x8l-mtp-Q2_0.gguf
for i in 1 2; do
  for bin in old head; do
    printf 'round %s %s ' "$i" "$bin"
    timeout 600 build-$bin/sluice bench -m $M --resident --no-warmup --prompt-file $PR/long4k.txt -p 4096 -b 1024 -n 4 -r 1 -t 2 2>&1 | grep -E '^\| Qwen' | tr '\n' ' '
    echo
  done
done
