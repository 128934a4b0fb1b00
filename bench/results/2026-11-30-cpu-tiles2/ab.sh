#!/bin/bash
# usage: ab.sh A B type "T list" reps
A=$1; B=$2; TY=$3; TS=$4; R=${5:-3}
for T in $TS; do
  for i in $(seq $R); do
    a=$(./$A $TY $T | sed -E 's/.*stream ([0-9.]+).*L2 ([0-9.]+).*/\1 \2/')
    b=$(./$B $TY $T | sed -E 's/.*stream ([0-9.]+).*L2 ([0-9.]+).*/\1 \2/')
    echo "T=$T  $A: $a   $B: $b"
  done
done
