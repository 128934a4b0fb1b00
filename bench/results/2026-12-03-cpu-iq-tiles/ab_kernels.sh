#!/bin/bash
# usage: ab_kernels.sh ROUNDS "bench args" binA binB ; prints per type max/median for each binary
R=$1; ARGS=$2; shift 2
RAW=$(mktemp); export RAW
for i in $(seq $R); do for b in "$@"; do $b $ARGS 2>&1 | awk -v b=$b '/GOP\/s/{next} NF>=5 && $1 ~ /^[A-Z]/ {print b, $1, $NF}'; done; done > "$RAW"
python3 - <<'PY'
import collections,statistics
d=collections.defaultdict(list)
for l in open(__import__('os').environ['RAW']):
    b,t,v=l.split(); 
    try: d[(t,b)].append(float(v))
    except: pass
for (t,b),v in sorted(d.items()):
    print(f"{t:8s} {b:40s} max {max(v):7.1f} median {statistics.median(v):7.1f} n={len(v)}")
PY
