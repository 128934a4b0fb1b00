#!/usr/bin/env python3
"""Sum Nsight Compute's kernel durations (ncu --csv --metrics gpu__time_duration.sum) per
forward pass and per kernel name: bench/cuda/ncu_steps.py ncu.csv [--detail]. A pass starts at
each embedding kernel; the table is for the last pass (a decode step)."""
import csv
import sys
from collections import defaultdict

rows = []
with open(sys.argv[1]) as f:
    for x in csv.DictReader(l for l in f if l.startswith('"')):
        if x['Metric Name'] != 'gpu__time_duration.sum':
            continue
        v = float(x['Metric Value'].replace(',', ''))
        scale = {'ns': 1e-3, 'usecond': 1, 'us': 1, 'msecond': 1e3, 'ms': 1e3}.get(x['Metric Unit'], 1e-3)
        rows.append((x['Kernel Name'], x['Grid Size'], v * scale))
steps = []
for r in rows:
    if 'embed' in r[0] or not steps:
        steps.append([])
    steps[-1].append(r)
for i, s in enumerate(steps):
    print(f"pass {i}: {len(s)} kernels, {sum(r[2] for r in s):.1f} us")
agg = defaultdict(lambda: [0, 0.0])
for name, grid, us in steps[-1]:
    k = name.split('(')[0]
    agg[k][0] += 1
    agg[k][1] += us
print(f"\n| kernel | calls | us | us/call |\n|---|---:|---:|---:|")
for k, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| `{k}` | {n} | {us:.1f} | {us / n:.2f} |")
if '--detail' in sys.argv:
    for name, grid, us in steps[-1]:
        print(f"{us:8.2f} {grid:>14} {name[:90]}")
