#!/usr/bin/env bash
# The lookahead's per-rank precision rule (look_rank_wanted, default 0.65) against every rank
# (SLUICE_MOE_LOOK_PRECISION=0), alternating, on the H200 machine's 16 cores:
#   1. h200_floor.sh's floor run (qwen4exp-8l Q2_0, 81 slots), each run followed by a replay of
#      its decode reads at depth 32;
#   2. the 35B-A3B shape Q4_K_M streamed at --cache 6G, `sluice bench -p 16 -n 64 -r 1 -t 16`.
#   OUT=$OUT bash bench/results/2026-12-03-synth-centred/h200_precision.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
synth_model
T=${THREADS:-16}
for round in 1 2; do
  for p in 0.65 0; do floor_run prec$p-r$round ngram_stall 32 SLUICE_MOE_LOOK_PRECISION=$p; done
done
rm -f "$M"
V=$(find "$W" -name ggml-vocab-qwen35.gguf | head -1)
s=$(date +%s)
timeout 200 "$C/sluice" synth --preset qwen35moe-35b-a3b --type Q4_K_M --vocab "$V" -o "$W/q35.gguf" -q -t 16 > "$OUT/synth35.txt" 2>&1
echo "synth35 rc=$? in $(( $(date +%s) - s )) s" >> "$OUT/synth35.txt"
for round in 1 2; do
  for p in 0.65 0; do
    drop
    SLUICE_MOE_LOOK_PRECISION=$p timeout 150 "$C/sluice" bench -m "$W/q35.gguf" --stream --cache 6G -p 16 -n 64 -r 1 -t "$T" --json -o "$OUT/q35-prec$p-r$round.json" > /dev/null 2> "$OUT/q35-prec$p-r$round.err"
    echo "rc=$?" >> "$OUT/q35-prec$p-r$round.err"
  done
done
for f in "$OUT"/synth.txt "$OUT"/synth35.txt "$OUT"/*.out "$OUT"/*.replay "$OUT"/*.json "$OUT"/*.err; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/*.json "$OUT"/*.err "$OUT"/synth*.txt
grep -E "^== |^prefill [0-9]|^decode experts|^depth|rc=|synth" "$OUT/all.txt"
python3 - "$OUT/all.txt" <<'PY' || true
import json, re, sys
t = open(sys.argv[1]).read()
for name, body in re.findall(r'== (q35-\S+\.json)\n(.*?)(?=\n== |\Z)', t, re.S):
    try:
        r = json.loads(body)['runs'][0]; e = r['experts']['decode']
        print(name, 'decode %.2f t/s io_wait %.2f misses %d read %.2f GB pf %d/%d %s' % (r['decode_tps'], e['io_wait_s'], e['misses'], e['bytes_read'] / 1e9, e['prefetch_used'], e['prefetch_issued'], r['evidence']['logits_sha256'][:12]))
    except Exception as ex:
        print(name, 'unreadable', ex)
PY
