#!/bin/bash
# binaries: $BK_DIR/bk_NAME (default /tmp), copies of build/bench_kernels from each revision
# usage: abt2.sh N types toks binA binB ...; 1 thread, 16 MiB rows, min over 20 reps per run; max/mean tile GOP/s
N=$1; T=$2; K=$3; shift 3
for i in $(seq $N); do for b in "$@"; do
  taskset -c 1 ${BK_DIR:-/tmp}/bk_$b --types $T --toks $K --threads 1 --mb 16 --reps 20 2>&1 | awk -v b=$b '/^q|^iq/ {print b, $1, $5}'
done; done | awk '{k=$1" "$2; if ($3>m[k]) m[k]=$3; s[k]+=$3; n[k]++} END {for (k in m) printf "%s max %.1f mean %.1f\n", k, m[k], s[k]/n[k]}' | sort
