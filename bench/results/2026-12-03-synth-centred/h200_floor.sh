#!/usr/bin/env bash
# Issue 10's floor run on the H200 machine's 16 CPU cores with the centred qwen4exp-8l Q2_0 file
# (synth after 1c4156c): teacher-forced decode of 64 tokens with the expert cache at its floor
# of 81 slots, streamed, against a replay of its own decode reads (iolog_replay, direct I/O at
# depths 32 and 128, page cache dropped) right after it, and against the resident decode of the
# same tokens. `ngram_stall` is this commit's lookahead (it waits for the layer's reads; the
# first MoE layer predicted from the embedding), `ngram_old` 1c4156c's (issued with the demand;
# no first-layer prediction), alternating; both in CPU_ARCHIVE (setup.sh).
#   OUT=$OUT bash bench/results/2026-12-03-synth-centred/h200_floor.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
{ date -u; nproc; lscpu | grep -E "Model name"; free -g; "$C/sluice" --version; } > "$OUT/env.txt" 2>&1
synth_model
T=${THREADS:-16}
for round in 1 2; do
  for bin in ngram_stall ngram_old; do floor_run $bin-r$round $bin "32 128"; done
done
timeout 120 "$C/ngram_stall" "$M" "$P" 48 64 512 "$T" resident forced > "$OUT/resident.out" 2>&1
echo "rc=$?" >> "$OUT/resident.out"
for f in "$OUT"/env.txt "$OUT"/synth.txt "$OUT"/*.out "$OUT"/*.replay; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/env.txt "$OUT"/synth.txt
grep -E "^== |^prefill [0-9]|^decode experts|^depth|rc=|synth" "$OUT/all.txt"
