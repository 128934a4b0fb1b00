#!/usr/bin/env python3
"""Sum Nsight Compute's kernel durations (ncu --csv --metrics gpu__time_duration.sum) per
forward pass and per kernel name: bench/cuda/ncu_steps.py ncu.csv [--detail]. A pass starts at
each embedding kernel; the table is for the last pass (a decode step). With --detail, every
kernel of that pass in order; when the CSV also has dram__bytes_read.sum (run_h200.sh prof with
NCU_MORE=1), its DRAM bytes and GB/s, achieved occupancy and registers per thread too."""
import csv
import sys
from collections import defaultdict

rows = []
extra = {}  # kernel ID -> {metric: value}
with open(sys.argv[1]) as f:
    for x in csv.DictReader(l for l in f if l.startswith('"')):
        v = float(x['Metric Value'].replace(',', ''))
        if x['Metric Name'] != 'gpu__time_duration.sum':
            unit = x['Metric Unit']
            if x['Metric Name'] == 'dram__bytes_read.sum':
                v *= {'byte': 1, 'Kbyte': 1e3, 'Mbyte': 1e6, 'Gbyte': 1e9}.get(unit, 1)
            extra.setdefault(x['ID'], {})[x['Metric Name']] = v
            continue
        scale = {'ns': 1e-3, 'usecond': 1, 'us': 1, 'msecond': 1e3, 'ms': 1e3}.get(x['Metric Unit'], 1e-3)
        rows.append((x['Kernel Name'], x['Grid Size'], v * scale, x['ID']))
steps = []
for r in rows:
    if 'embed' in r[0] or not steps:
        steps.append([])
    steps[-1].append(r)
for i, s in enumerate(steps):
    print(f"pass {i}: {len(s)} kernels, {sum(r[2] for r in s):.1f} us")
agg = defaultdict(lambda: [0, 0.0])
for name, grid, us, _ in steps[-1]:
    k = name.split('(')[0]
    agg[k][0] += 1
    agg[k][1] += us
print(f"\n| kernel | calls | us | us/call |\n|---|---:|---:|---:|")
for k, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| `{k}` | {n} | {us:.1f} | {us / n:.2f} |")
if '--detail' in sys.argv:
    for name, grid, us, kid in steps[-1]:
        e = extra.get(kid, {})
        more = ''
        if 'dram__bytes_read.sum' in e:
            b = e['dram__bytes_read.sum']
            more = (f" {b / 1e6:8.2f} MB {b / us / 1e3:7.0f} GB/s"
                    f" occ {e.get('sm__warps_active.avg.pct_of_peak_sustained_active', 0):5.1f}%"
                    f" regs {e.get('launch__registers_per_thread', 0):4.0f}")
        print(f"{us:8.2f} {grid:>14}{more} {name[:70]}")
