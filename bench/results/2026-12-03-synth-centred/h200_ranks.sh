#!/usr/bin/env bash
# The floor run of h200_floor.sh with the lookahead predicting a decode token's top N experts
# only (SLUICE_MOE_LOOK_RANKS=N; 10 = top-k, the default), alternating, each run followed by a
# replay of its decode reads at depth 32.
#   OUT=$OUT bash bench/results/2026-12-03-synth-centred/h200_ranks.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
synth_model
T=${THREADS:-16}
for round in 1 2; do
  for r in ${RANKS:-10 7 5 3}; do
    N=ranks$r-r$round
    drop
    SLUICE_MOE_LOOK_RANKS=$r SLUICE_IO_LOG=$OUT/$N.iolog timeout 120 "$C/ngram_stall" "$M" "$P" 48 64 512 "$T" stream forced 81 > "$OUT/$N.out" 2>&1
    echo "rc=$?" >> "$OUT/$N.out"
    pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' "$OUT/$N.out")
    pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' "$OUT/$N.out")
    drop; timeout 60 "$C/iolog_replay" "$OUT/$N.iolog" 32 $(( ${pe:-0} + ${pn:-0} )) > "$OUT/$N.replay" 2>&1
    rm -f "$OUT/$N.iolog"
  done
done
for f in "$OUT"/synth.txt "$OUT"/*.out "$OUT"/*.replay; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/all.txt"
rm -f "$OUT"/*.out "$OUT"/*.replay "$OUT"/synth.txt
grep -E "^== |^prefill [0-9]|^decode experts|^depth|rc=" "$OUT/all.txt"
