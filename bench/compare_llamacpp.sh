#!/usr/bin/env bash
# Side-by-side: sluice bench and llama.cpp's llama-bench on the same GGUF, same thread count.
#
#   bench/compare_llamacpp.sh MODEL.gguf [-p 512,2048] [-n 64] [-r 2] [-t 2] [-o OUT.md]
#
# Environment: LLAMA_BENCH (llama-bench binary; default: llama-bench on PATH; built outside the
# repository, never committed; on AMX-capable hosts use a build without AMX), SLUICE (sluice binary; default build/sluice),
# BENCH_KERNELS (default: next to SLUICE) to measure the memory read bandwidth for the roofline,
# SLUICE_ARGS (extra flags for sluice bench, e.g. --mlock), LLAMA_ARGS (extra flags for llama-bench).
#
# Prints (and with -o writes) a markdown report: machine facts and load before/after, the exact
# commands, raw CSV of both tools, and a table of tokens/s with sluice/llama.cpp ratios. Decode
# is also given against the roofline: bytes per token (every non-expert tensor except the token
# embedding, plus used/total of the routed-expert tensors) / the read bandwidth measured just
# before and just after that tool's run (their mean; the host's bandwidth moves minute to minute).
set -euo pipefail

usage() { sed -n '2,12p' "$0"; exit 2; }
[ $# -ge 1 ] || usage
MODEL=$1; shift
P=512,2048; N=64; R=2; T=2; OUT=
while [ $# -gt 0 ]; do
  case $1 in
    -p) P=$2; shift 2 ;; -n) N=$2; shift 2 ;; -r) R=$2; shift 2 ;; -t) T=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;; *) usage ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_BENCH=${LLAMA_BENCH:-$(command -v llama-bench || echo llama-bench)}
SLUICE=${SLUICE:-$ROOT/build/sluice}
BENCH_KERNELS=${BENCH_KERNELS:-$(dirname "$SLUICE")/bench_kernels}
for b in "$LLAMA_BENCH" "$SLUICE"; do [ -x "$b" ] || { echo "missing $b" >&2; exit 1; }; done
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }

# bytes read per decoded token, from sluice's tensor listing
INFO=$("$SLUICE" info -m "$MODEL" --tensors)
BPT=$(awk '
  /expert_used_count/ {used=$2} /\.expert_count/ {cnt=$2}
  /^  [A-Za-z0-9_.]+\.weight +[A-Z0-9_]+ +\[/ {
    name=$1; b=$NF; if (name ~ /token_embd/) next
    if (name ~ /_exps\./) ex+=b; else other+=b }
  END { if (!cnt) {cnt=1; used=1}; printf "%.0f", other + ex*used/cnt }' <<<"$INFO")

# The read bandwidth, measured before sluice, between the two tools and after llama.cpp: on a
# shared host it moves by tens of percent from minute to minute, so each tool's decode is set
# against the mean of the two measurements around its own run.
bw() {
  [ -x "$BENCH_KERNELS" ] || return 0
  "$BENCH_KERNELS" --bw-only --threads "$T" --mb 2048 --reps 3 | awk '/memory read bandwidth/ {print $(NF-3)}'
}
mean() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", (a + b) / 2}'; }

LOAD0=$(load)
SL_CMD=("$SLUICE" bench -m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" --csv ${SLUICE_ARGS:-})
LB_CMD=("$LLAMA_BENCH" -m "$MODEL" -p "$P" -n "$N" -r "$R" -t "$T" -o csv ${LLAMA_ARGS:-})
BW0=$(bw)
"${SL_CMD[@]}" > "$TMP/sluice.csv" 2> "$TMP/sluice.err"
LOAD1=$(load)
BW1=$(bw)
"${LB_CMD[@]}" > "$TMP/llama.csv" 2> "$TMP/llama.err"
LOAD2=$(load)
BW2=$(bw)
BWS=$(mean "$BW0" "$BW1"); BWL=$(mean "$BW1" "$BW2")

# CSV to fields: quoted fields lose their quotes and any comma inside them (a model name such
# as "Qwen3-30B-A3B (synthetic), 4 layers" is one field), then split at commas
UNQUOTE='{ while (match($0, /"[^"]*"/)) { f = substr($0, RSTART + 1, RLENGTH - 2); gsub(/,/, ";", f);
             $0 = substr($0, 1, RSTART - 1) f substr($0, RSTART + RLENGTH) } }'
# sluice: mean prefill t/s per prompt length, decode t/s of the shortest prompt's runs
read_sluice() {
  awk -F, "$UNQUOTE"'
    NR==1 {for (i=1;i<=NF;i++) h[$i]=i; next}
    { p=$h["n_prompt"]; pf[p]+=$h["prefill_tps"]; dc[p]+=$h["decode_tps"]; c[p]++ }
    END { for (p in c) printf "%s %.3f %.3f\n", p, pf[p]/c[p], dc[p]/c[p] }' "$TMP/sluice.csv" | sort -n
}
# llama-bench: avg_ts of pp<P> and tg<N> rows
read_llama() {
  awk -F, "$UNQUOTE"'
    NR==1 {for (i=1;i<=NF;i++) h[$i]=i; next}
    { np=$h["n_prompt"]; ng=$h["n_gen"]; ts=$h["avg_ts"];
      if (ng==0) printf "pp %s %.3f\n", np, ts; else printf "tg %s %.3f\n", ng, ts }' "$TMP/llama.csv"
}
SL=$(read_sluice); LB=$(read_llama)

{
  echo "## $(basename "$MODEL")"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); sluice $(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo ?)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)'); llama.cpp $(grep -o '"build_commit":"[^"]*"' "$TMP/llama.err" 2>/dev/null | head -1 || true)$(awk -F, 'NR==2 {gsub(/"/,""); print $1}' "$TMP/llama.csv")"
  echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM; threads $T"
  echo "- load average (1/5/15 min): before $LOAD0, after sluice $LOAD1, after llama.cpp $LOAD2"
  echo "- memory read bandwidth (bench_kernels --bw-only, $T threads) before sluice, between the tools, after llama.cpp: ${BW0:-n/a} / ${BW1:-n/a} / ${BW2:-n/a} GB/s; bytes per decoded token: $(awk -v b="$BPT" 'BEGIN {printf "%.3f GB", b/1e9}')"
  echo "- sluice: \`${SL_CMD[*]}\`"
  echo "- llama.cpp: \`${LB_CMD[*]}\` (defaults: f16 KV cache, flash attention auto)"
  echo
  echo "| test | llama.cpp t/s | sluice t/s | sluice / llama.cpp |"
  echo "|---|---:|---:|---:|"
  for p in ${P//,/ }; do
    l=$(awk -v p="$p" '$1=="pp" && $2==p {print $3}' <<<"$LB")
    s=$(awk -v p="$p" '$1==p {print $2}' <<<"$SL")
    echo "| prefill $p | ${l:-n/a} | ${s:-n/a} | $(awk -v a="$s" -v b="$l" 'BEGIN {if (b>0 && a>0) printf "%.2fx", a/b; else print "n/a"}') |"
  done
  l=$(awk -v n="$N" '$1=="tg" && $2==n {print $3}' <<<"$LB")
  s=$(head -1 <<<"$SL" | awk '{print $3}')
  echo "| decode $N (sluice after the shortest prompt) | ${l:-n/a} | ${s:-n/a} | $(awk -v a="$s" -v b="$l" 'BEGIN {if (b>0 && a>0) printf "%.2fx", a/b; else print "n/a"}') |"
  if [ -n "$BWS" ] && [ -n "$BWL" ]; then
    echo
    echo "Decode roofline (bytes per token / the bandwidth around each tool's run): sluice" \
      "$(awk -v b="$BPT" -v w="$BWS" -v s="$s" 'BEGIN {printf "%.0f%% of %.2f t/s (%s GB/s)", 100*s*b/(w*1e9), w*1e9/b, w}'), llama.cpp" \
      "$(awk -v b="$BPT" -v w="$BWL" -v s="$l" 'BEGIN {printf "%.0f%% of %.2f t/s (%s GB/s)", 100*s*b/(w*1e9), w*1e9/b, w}')."
  fi
  echo
  echo "<details><summary>raw CSV</summary>"
  echo
  echo '```'
  cat "$TMP/sluice.csv"; echo; cat "$TMP/llama.csv"
  echo '```'
  echo "</details>"
  echo
} | tee ${OUT:+-a "$OUT"}
