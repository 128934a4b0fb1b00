#!/usr/bin/env bash
# Shadow steps A/B: the adaptive MTP policy of two builds (OLD without shadow steps, NEW with)
# at chosen acceptances, each round one plain run and then every configuration with OLD and NEW,
# alternating, so that every ratio is to the plain run of the same phase of the host. Usage:
#   M=MODELS/q4x8l-mtp-Q2_0.gguf OLD=old/sluice NEW=build/sluice \
#   PROMPT=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/p1.txt ab_shadow.sh [ROUNDS] [N_GEN]
# MODE (default --resident) sets the memory plan (e.g. MODE="--cache 91x"); CONFIGS the
# "|"-separated --mtp configurations. Output: vm_mtp_accept.sh's lines, labelled "old ..." /
# "new ..."; ratios.py of 2026-12-04-mtp-accept reads them (each config over the round's plain).
set -u
R=${1:-3}; N=${2:-128}
CONFIGS=${CONFIGS:-"--mtp 1 --mtp-accept 0|--mtp 1 --mtp-accept 0.756|--mtp 1 --mtp-accept 0.97"}
run() { # BIN args...
    local bin=$1; shift
    "$bin" bench -m "$M" ${MODE:---resident} --prompt-file "$PROMPT" -p 48 -n "$N" -r "${REPS:-1}" -t 2 --json "$@" 2>/dev/null |
        python3 "$(dirname "$0")/../2026-12-04-mtp-accept/summary.py"
}
for i in $(seq "$R"); do
    printf '%-34s ' plain; run "$NEW"
    IFS='|' read -ra cfgs <<< "$CONFIGS"
    for c in "${cfgs[@]}"; do
        printf '%-34s ' "old $c"; run "$OLD" $c
        printf '%-34s ' "new $c"; run "$NEW" $c
    done
done
