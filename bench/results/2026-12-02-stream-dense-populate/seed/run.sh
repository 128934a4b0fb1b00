#!/bin/bash
# the seed's streamed protocol (four prompts cold, 8 GiB cgroup), before / after, alternating
set -u
R=CHECKOUT/bench/results/2026-11-29-qwen4exp-8l-stream-8g
M=MODELS/q4x8l-Q2_0.gguf
for p in 1 2 3 4; do
  for v in before after; do
    B=build-before/sluice; [ $v = after ] && B=build/sluice
    $R/run_one.sh $v-p$p 8G . $B bench -m $M --stream --json -o $v-p$p.json --no-warmup --prompt-file $R/prompts/p$p.txt -p 48 -n 64 -r 1 -t 2 > /dev/null
  done
done
echo done > run.done
