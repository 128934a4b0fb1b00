#!/usr/bin/env bash
# The floor run of h200_floor.sh with the lookahead predicting a decode token's top N experts
# only (SLUICE_MOE_LOOK_RANKS=N; 10 = top-k, the default), alternating, each run followed by a
# replay of its decode reads at depth 32. SLUICE_MOE_LOOK_RANKS was a measurement knob of e3a5a34's
# parent, replaced by SLUICE_MOE_LOOK_PRECISION: at a later commit every run here reads the
# ranks look_rank_wanted picks.
#   OUT=$OUT bash bench/results/2026-12-03-synth-centred/h200_ranks.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
synth_model
T=${THREADS:-16}
for round in 1 2; do
  for r in ${RANKS:-10 7 5 3}; do floor_run ranks$r-r$round ngram_stall 32 SLUICE_MOE_LOOK_RANKS=$r; done
done
for f in "$OUT"/synth.txt "$OUT"/*.out "$OUT"/*.replay; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/synth.txt
grep -E "^== |^prefill [0-9]|^decode experts|^depth|rc=" "$OUT/all.txt"
