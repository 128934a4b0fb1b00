#!/usr/bin/env bash
# The MTP follow's lag, A/B on one host: plain decode, --mtp 1 (adaptive; one-token passes
# queue their follow), and --mtp 1 with SLUICE_MTP_LAG=0 (every pass followed at once),
# alternating, ROUNDS times. Usage: M=MODELS/q4x8l-mtp-Q2_0.gguf BIN=build/sluice \
#   PROMPT=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/p1.txt vm_mtp_lag.sh [ROUNDS] [EXTRA...]
set -u
R=${1:-3}; shift || true
run() { # label, env..., -- extra args
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" "$BIN" bench -m "$M" --resident --no-warmup --prompt-file "$PROMPT" -p 48 -n 128 -r 1 -t 2 \
        --csv "$@" 2>/dev/null | awk -F, -v l="$label" 'NR==1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
            {printf "%-22s decode %6.2f t/s p50 %6.2f ms tokens %s logits %s\n", l, $c["decode_tps"], $c["tpot_p50_ms"], substr($c["tokens_sha256"],1,12), substr($c["logits_sha256"],1,12)}'
}
for i in $(seq "$R"); do
    run plain X=1 -- "$@"
    run "mtp1 lag" X=1 -- --mtp 1 "$@"
    run "mtp1 SLUICE_MTP_LAG=0" SLUICE_MTP_LAG=0 -- --mtp 1 "$@"
done
