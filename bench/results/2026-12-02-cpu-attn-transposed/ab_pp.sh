#!/bin/bash
# alternate old and new sluice on pp2048, print prefill t/s and logits hash
M=$1; N=$2
for i in $(seq $N); do
  for x in old new; do
    b=OLD/sluice; [ $x = new ] && b=NEW/sluice
    r=$($b bench -m $M -p 2048 -n 0 -r 1 -t 2 --no-warmup 2>/dev/null | grep "^| Qwen")
    echo "$x $(echo "$r" | awk -F'|' '{print $6, $(NF-1)}')"
  done
done
