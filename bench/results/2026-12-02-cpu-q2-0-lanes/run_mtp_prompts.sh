#!/bin/sh
# HEAD binary (6dd8429), four prompts, plain against --mtp 2 (adaptive), alternating, two rounds.
D=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
M=MODELS/q4x8l-mtp-Q2_0.gguf
for i in 1 2; do
  for p in p1 p2 p3 p4; do
    for v in "" "--mtp 2"; do
      printf 'round %s %s [%s] ' "$i" "$p" "$v"
      build/sluice bench -m $M --resident --prompt-file $D/$p.txt -p 48 -n 128 -r 2 -t 2 $v 2>&1 | grep -E '^\| Qwen|MTP|bench: prompt' | tr '\n' ' '
      echo
    done
  done
done
