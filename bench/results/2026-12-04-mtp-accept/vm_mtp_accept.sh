#!/usr/bin/env bash
# MTP decode at chosen acceptances (sluice bench --mtp-accept), against plain decoding, all in
# one loop so that every round sees the same phase of the host. Usage:
#   M=MODELS/q4x8l-mtp-Q2_0.gguf BIN=build/sluice \
#   PROMPT=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/p1.txt vm_mtp_accept.sh [ROUNDS] [N_GEN] [EXTRA...]
# MODE (default --resident) sets the memory plan, e.g. MODE="--cache 3G" (streamed); CONFIGS the
# "|"-separated configurations ("plain" for plain decoding). REPS (default 1) runs each that many
# times in its process and reports the last: with a streamed MODE use REPS=2, so that plain
# decoding, like the --mtp-accept runs (whose untimed recording run decodes the same tokens
# first), runs with the expert cache its own earlier run left.
set -u
R=${1:-3}; N=${2:-128}; shift 2 || shift $#
CONFIGS=${CONFIGS:-"plain|--mtp 1 --mtp-accept 0.53|--mtp 1 --mtp-accept 0.756|--mtp 1 --mtp-accept 0.97|--mtp 2 --mtp-accept 0.756|--mtp 2 --mtp-accept 0.97|--mtp 3 --mtp-accept 0.97"}
run() { # args...
    "$BIN" bench -m "$M" ${MODE:---resident} --prompt-file "$PROMPT" -p 48 -n "$N" -r "${REPS:-1}" -t 2 --json "$@" 2>/dev/null |
        python3 "$(dirname "$0")/summary.py"
}
for i in $(seq "$R"); do
    IFS='|' read -ra cfgs <<< "$CONFIGS"
    for c in "${cfgs[@]}"; do
        if [ "$c" = plain ]; then printf '%-30s ' plain; run "$@"; else printf '%-30s ' "$c"; run $c "$@"; fi
    done
done
