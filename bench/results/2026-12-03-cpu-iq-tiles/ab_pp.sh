#!/bin/bash
# Alternating prefill A/B: ab_pp.sh OLD NEW ROUNDS MODEL... ; sluice bench -p 512 -n 0 -r 1 -t 2 --csv
OLD=$1; NEW=$2; R=$3; shift 3
for m in "$@"; do for i in $(seq $R); do for b in "$OLD" "$NEW"; do
  "$b" bench -m "$m" -p 512 -n 0 -r 1 -t 2 --csv 2>/dev/null | tail -1 | awk -F, -v b="$b" -v m="$(basename $m)" '{print m, b, $5, $8, substr($(NF-1),1,12)}'
done; done; done
