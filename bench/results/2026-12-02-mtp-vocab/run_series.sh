#!/bin/bash
# four prompts, alternating plain / --mtp 2, resident
P=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
S=${SLUICE:-build/sluice}
for round in $(seq 1 ${ROUNDS:-2}); do
 for p in p1 p2 p3 p4; do
  for mode in plain mtp; do
   extra=""; [ $mode = mtp ] && extra="--mtp 2"
   out=$($S bench -m MODELS/q4x8l-mtp-Q2_0.gguf --resident --prompt-file $P/$p.txt -p 48 -n 128 -r 2 -t 2 $extra 2>&1)
   dec=$(echo "$out" | grep "^| Qwen" | awk -F'|' '{print $8}')
   tp=$(echo "$out" | grep "^| Qwen" | awk -F'|' '{print $9}')
   h=$(echo "$out" | grep "^| Qwen" | awk -F'|' '{print $12}')
   m=$(echo "$out" | grep "^MTP" | sed 's/MTP 2 drafts\/step //')
   echo "round $round $p $mode: decode $dec TPOT $tp hash $h $m"
  done
 done
done
