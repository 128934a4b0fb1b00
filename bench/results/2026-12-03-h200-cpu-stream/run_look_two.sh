#!/usr/bin/env bash
# As run.sh, 16 threads: the floor run with the lookahead one layer ahead (SLUICE_MOE_LOOK_TWO=0)
# and two layers ahead (=1), alternating, three rounds; each run followed by replays of its
# decode's reads at depths 32 and 128 (REPLAY=0: no replays; ROUNDS=N rounds, default 3).
#   OUT=$OUT bash bench/results/2026-12-03-h200-cpu-stream/run_look_two.sh
set -u
. bench/results/2026-12-03-h200-cpu-stream/setup.sh
[ -f "$M" ] || synth_model
"$C/sluice" --version > "$OUT/all.txt"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in 0 1; do
    N=two$v-r$r
    drop
    SLUICE_MOE_LOOK_TWO=$v SLUICE_IO_LOG=$OUT/$N.iolog timeout 150 "$C/ngram_stall" "$M" "$P" 48 64 512 16 stream forced 81 > "$OUT/$N.out" 2>&1
    echo "rc=$?" >> "$OUT/$N.out"
    pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' "$OUT/$N.out")
    pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' "$OUT/$N.out")
    for d in 32 128; do [ "${REPLAY:-1}" = 0 ] && break; drop; timeout 60 "$C/iolog_replay" "$OUT/$N.iolog" $d $(( ${pe:-0} + ${pn:-0} )); done > "$OUT/$N.replay" 2>&1
    rm -f "$OUT/$N.iolog"
    { echo "== $N"; grep -E "^prefill [0-9]|^decode experts|rc=" "$OUT/$N.out"; cat "$OUT/$N.replay"; } >> "$OUT/all.txt"
    rm -f "$OUT/$N.out" "$OUT/$N.replay"
  done
done
cat "$OUT/all.txt"
