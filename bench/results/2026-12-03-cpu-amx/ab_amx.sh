#!/bin/bash
# AMX on / off with one binary, alternating: ab_amx.sh SLUICE ROUNDS MODEL...
# (SLUICE_AMX=0 registers the VNNI tiles this processor gets without AMX); sluice bench -p 512,2048 -n 0 -r 1 -t 2
S=$1; R=$2; shift 2
for m in "$@"; do for i in $(seq $R); do for amx in 1 0; do
  SLUICE_AMX=$amx "$S" bench -m "$m" -p 512,2048 -n 0 -r 1 -t 2 --csv 2>/dev/null | tail -2 |
    awk -F, -v a="$amx" -v m="$(basename $m)" '{print m, "AMX=" a, "p" $5, $8, substr($(NF-1),1,12)}'
done; done; done
