#!/bin/bash
# binaries: $BK_DIR/bk_NAME (default /tmp), copies of build/bench_kernels from each revision
# usage: ab.sh N types threads binA binB ... ; prints max L2 GB/s per binary per type
N=$1; T=$2; TH=$3; shift 3
for i in $(seq $N); do for b in "$@"; do
  ${BK_DIR:-/tmp}/bk_$b --types $T --toks 1 --threads $TH --mb 16 --reps 3 2>&1 | awk -v b=$b '/^q|^iq/ {print b, $1, $4}'
done; done | awk '{k=$1" "$2; if ($3>m[k]) m[k]=$3; s[k]+=$3; n[k]++} END {for (k in m) printf "%s max %.2f mean %.2f\n", k, m[k], s[k]/n[k]}' | sort
