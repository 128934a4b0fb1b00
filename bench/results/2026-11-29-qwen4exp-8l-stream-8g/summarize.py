#!/usr/bin/env python3
"""One line per bench run of this directory: speeds, TPOT, expert I/O, hashes, cgroup, load."""
import glob, json, os, re
def meta(name):
    m = {}
    if os.path.exists(name + '.meta'):
        for line in open(name + '.meta'):
            k, _, v = line.partition(': ')
            m[k.strip()] = v.strip()
    return m
def cpu(name):
    try:
        for line in open(name + '.err'):
            if 'Percent of CPU' in line: return line.split(': ')[1].strip()
    except OSError: pass
    return '?'
def load(s):
    x = re.search(r'load average: ([\d.]+)', s or '')
    return x.group(1) if x else '?'
print('| run | mode | prefill t/s | decode t/s | TPOT p50/p95/p99 ms | decode hits/misses | decode MB read/token | io wait s | prefetch used/issued | peak RSS GiB | cg max GB | logits / tokens sha256 | load 1m before/after | CPU share |')
print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|')
for f in sorted(glob.glob('*.json')):
    n = f[:-5]
    try: d = json.load(open(f))
    except Exception: continue
    if 'runs' not in d: continue
    m = meta(n)
    for r in d['runs']:
        e = r['experts']['decode']
        ev = r['evidence']
        cg = m.get('cgroup max usage')
        print(f"| {n} (p{r['n_prompt']}+n{r['n_gen']}) | {d['plan']['mode']} | {r['prefill_tps']:.2f} | {r['decode_tps']:.2f} | "
              f"{r['tpot_ms']['p50']:.0f}/{r['tpot_ms']['p95']:.0f}/{r['tpot_ms']['p99']:.0f} | {e['hits']}/{e['misses']} | "
              f"{e['bytes_read']/1e6/max(r['n_gen'],1):.2f} | {e['io_wait_s']:.2f} | {e['prefetch_used']}/{e['prefetch_issued']} | "
              f"{r['peak_rss_bytes']/2**30:.2f} | {int(cg)/1e9:.2f} | {ev['logits_sha256'][:12]} / {ev['tokens_sha256'][:12]} | "
              f"{load(m.get('uptime before'))}/{load(m.get('uptime after'))} | {cpu(n)} |" if cg else
              f"| {n} (p{r['n_prompt']}+n{r['n_gen']}) | {d['plan']['mode']} | {r['prefill_tps']:.2f} | {r['decode_tps']:.2f} | "
              f"{r['tpot_ms']['p50']:.0f}/{r['tpot_ms']['p95']:.0f}/{r['tpot_ms']['p99']:.0f} | {e['hits']}/{e['misses']} | "
              f"{e['bytes_read']/1e6/max(r['n_gen'],1):.2f} | {e['io_wait_s']:.2f} | {e['prefetch_used']}/{e['prefetch_issued']} | "
              f"{r['peak_rss_bytes']/2**30:.2f} | - | {ev['logits_sha256'][:12]} / {ev['tokens_sha256'][:12]} | "
              f"{load(m.get('uptime before'))}/{load(m.get('uptime after'))} | {cpu(n)} |")
