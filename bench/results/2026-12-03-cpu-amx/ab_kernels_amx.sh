#!/bin/bash
# One core, cache-resident 2 MiB matrix, tile GOP/s at 16/32/64/128 tokens: the AMX tiles, the
# VNNI byte tiles (SLUICE_K45_SCALE=mullo) and this processor's default without AMX (Q6_K and
# the IQ types then take the int16 kq tiles), two alternating rounds: ab_kernels_amx.sh BENCH_KERNELS
B=$1
for round in 1 2; do for t in 16 32 64 128; do
  for e in "SLUICE_AMX=1" "SLUICE_AMX=0 SLUICE_K45_SCALE=mullo" "SLUICE_AMX=0"; do
    echo "round $round toks $t $e: $(env $e $B --threads 1 --types Q4_K,Q5_K,Q6_K,IQ4_XS,IQ3_XXS,IQ2_XS --toks $t --mb 2 --reps 10 2>&1 | tail -6 | awk '{printf "%s %s  ", $1, $NF}')"
  done
done; done
