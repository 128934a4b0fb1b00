#!/usr/bin/env bash
# The day's streaming changes together on the H200 machine's 16 cores, centred qwen4exp-8l Q2_0:
#   1. h200_floor.sh's floor run, `ngram_stall` (this commit) against `ngram_old` (1c4156c:
#      the lookahead with the demand, every rank, no first-layer prediction, 64 n-gram reads in
#      flight), alternating, each followed by a replay of its decode reads at depth 32;
#   2. the seed's protocol in an 8 GiB memory cgroup (v2; --mem-budget 8G where one cannot be
#      made): decode of 128 tokens after each of four 48-token prompts from a cold page cache
#      (auto plan), the resident decode of the same (no limit, file in the page cache), and a
#      ~4K-token prompt prefilled in 1K chunks.
#   OUT=$OUT bash bench/results/2026-12-03-synth-centred/h200_final.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
synth_model
T=16
for round in 1 2; do
  for bin in ngram_stall ngram_old; do floor_run $bin-r$round $bin 32; done
done
PR=$PWD/bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
CG=/sys/fs/cgroup/sluice-q4x
LIMIT=""
if mkdir -p "$CG" 2>/dev/null && echo 8G > "$CG/memory.max" 2>/dev/null && echo 0 > "$CG/memory.swap.max" 2>/dev/null; then
  echo "cgroup v2 $CG: memory.max $(cat $CG/memory.max)" > "$OUT/limit.txt"
else
  LIMIT="--mem-budget 8G"; echo "no cgroup: --mem-budget 8G" > "$OUT/limit.txt"
fi
incg() { if [ -z "$LIMIT" ]; then (echo $BASHPID > "$CG/cgroup.procs"; exec "$@"); else "$@"; fi; }
for p in 1 2 3 4; do
  drop
  incg timeout 150 "$C/sluice" bench -m "$M" $LIMIT --no-warmup --prompt-file "$PR/p$p.txt" -p 48 -n 128 -r 1 -t "$T" --json -o "$OUT/stream-p$p.json" > /dev/null 2> "$OUT/stream-p$p.err"
  echo "rc=$? peak $(cat $CG/memory.peak 2>/dev/null)" >> "$OUT/stream-p$p.err"
done
drop
incg timeout 200 "$C/sluice" bench -m "$M" $LIMIT --no-warmup --prompt-file "$PR/long4k.txt" -p 4096 -b 1024 -n 0 -r 1 -t "$T" --json -o "$OUT/stream-4k.json" > /dev/null 2> "$OUT/stream-4k.err"
echo "rc=$?" >> "$OUT/stream-4k.err"
cat "$M" > /dev/null
for p in 1 2 3 4; do
  timeout 150 "$C/sluice" bench -m "$M" --resident --no-warmup --prompt-file "$PR/p$p.txt" -p 48 -n 128 -r 1 -t "$T" --json -o "$OUT/res-p$p.json" > /dev/null 2> "$OUT/res-p$p.err"
done
timeout 200 "$C/sluice" bench -m "$M" --resident --no-warmup --prompt-file "$PR/long4k.txt" -p 4096 -b 1024 -n 0 -r 1 -t "$T" --json -o "$OUT/res-4k.json" > /dev/null 2> "$OUT/res-4k.err"
python3 - "$OUT" > "$OUT/protocol.txt" 2>&1 <<'PY'
import json, os, sys
o = sys.argv[1]
for n in ['stream-p1', 'stream-p2', 'stream-p3', 'stream-p4', 'stream-4k', 'res-p1', 'res-p2', 'res-p3', 'res-p4', 'res-4k']:
    try:
        r = json.load(open(os.path.join(o, n + '.json')))['runs'][0]
        e = r.get('experts', {}).get('decode', {})
        g = r.get('ngram', {})
        print(n, 'prefill %.1f t/s decode %.2f t/s' % (r.get('prefill_tps', 0), r.get('decode_tps', 0)),
              'decode reads %.1f MB io_wait %.3f s' % (e.get('bytes_read', 0) / 1e6, e.get('io_wait_s', 0)),
              'ngram', json.dumps(g)[:300], r['evidence']['logits_sha256'][:12], r['evidence'].get('tokens_sha256', '')[:12])
    except Exception as ex:
        print(n, 'unreadable', ex, open(os.path.join(o, n + '.err')).read()[-300:] if os.path.exists(os.path.join(o, n + '.err')) else '')
PY
for f in "$OUT"/synth.txt "$OUT"/limit.txt "$OUT"/*.out "$OUT"/*.replay "$OUT"/protocol.txt "$OUT"/stream-p1.json; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
tail -3 "$OUT"/*.err >> "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/*.json "$OUT"/*.err "$OUT"/synth.txt "$OUT"/limit.txt
grep -E "^== |^prefill [0-9]|^decode experts|^ngram decode:|^depth|rc=|cgroup|budget" "$OUT/all.txt" | sed 's/ngram decode:.*per token/ngram per token/'
cat "$OUT/protocol.txt"
