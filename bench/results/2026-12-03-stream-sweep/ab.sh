#!/usr/bin/env bash
# Streamed prefill before (OLD = f917081) and after (NEW = the sweep victims), alternating, on
# the 35B-A3B shape (MODELS/q35.gguf: sluice synth --preset qwen35moe-35b-a3b --type Q4_K_M).
# Per run: prefill / decode t/s per repetition, bytes read per repetition, evidence hash,
# wall and CPU busy (/usr/bin/time).
#   ab.sh OLD NEW MODEL ROUNDS -- BENCH ARGS...
set -u
OLD=$1 NEW=$2 M=$3 ROUNDS=$4; shift 5
for r in $(seq 1 "$ROUNDS"); do
  for b in "$OLD" "$NEW"; do
    /usr/bin/time -f "%e s wall %P cpu" "$b" bench -m "$M" --json "$@" -t 2 >/tmp/ab.json 2>/tmp/ab.err
    python3 - "$b" <<'PY'
import json, sys
d = json.load(open('/tmp/ab.json'))
t = open('/tmp/ab.err').read().strip().splitlines()[-1]
runs = d['runs']
pf = ' '.join('%.2f' % r['prefill_tps'] for r in runs)
dc = ' '.join('%.2f' % r['decode_tps'] for r in runs)
gb = ' '.join('%.2f' % ((r['experts']['prefill']['bytes_read'] + r['experts']['decode']['bytes_read']) / 1e9) for r in runs)
print('%s: prefill %s | decode %s | GB read %s | %s | %s' % (sys.argv[1], pf, dc, gb, runs[-1]['evidence']['logits_sha256'][:12], t))
PY
  done
done
