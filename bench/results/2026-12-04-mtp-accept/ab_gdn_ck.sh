#!/usr/bin/env bash
# Drafted steps before / after the one-pass Gated DeltaNet recurrence with checkpoints
# (gated_delta_ck): two binaries alternating, --mtp-always so that every step is a drafted one.
# Usage: M=MODELS/q4x8l-mtp-Q2_0.gguf PROMPT=.../p1.txt ab_gdn_ck.sh OLD NEW [ROUNDS]
set -u
OLD=$1; NEW=$2; R=${3:-4}
for i in $(seq "$R"); do
    for b in "$OLD" "$NEW"; do
        for c in "--mtp 1 --mtp-always --mtp-accept 0.97" "--mtp 3 --mtp-always --mtp-accept 0.97"; do
            printf '%-16s %-40s ' "$(basename "$b")" "$c"
            "$b" bench -m "$M" --resident --prompt-file "$PROMPT" -p 48 -n 128 -r 1 -t 2 --csv $c 2>/dev/null |
                awk -F, 'NR==1 {for (i = 1; i <= NF; i++) h[$i] = i; next} {print "decode", $h["decode_tps"], "t/s logits", substr($h["logits_sha256"], 1, 12)}'
        done
    done
done
