#!/usr/bin/env bash
# End-to-end checks of synth, bench, --trace-routing, cachesim and perplexity through the CLI:
#  - bench's JSON carries identical logits/token SHA-256 across two runs and across 1 vs 2 threads
#  - the evidence files hash to what the JSON says
#  - run/bench routing traces replay in cachesim (which writes its SVG)
#  - bad inputs give one line on stderr and a non-zero exit
# usage: test_tools.sh SLUICE WORKDIR
set -u
SLUICE=$1
WORK=$2/cli-tools
rm -rf "$WORK"
mkdir -p "$WORK"
fail=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail + 1)); }
check() { if "$@"; then ok; else bad "$*"; fi; }

# one-line error and non-zero exit
one_line_error() {
  local out rc
  out=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then bad "expected failure: $*"; return; fi
  if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || [ -z "$out" ]; then bad "not one line: $* -> $out"; return; fi
  ok
}

M=$WORK/tiny.gguf
check "$SLUICE" synth -q --preset qwen3moe-tiny --type Q4_K_M --routing-skew 1 -o "$M"

hashes() { grep -E '"(logits|tokens)_sha256"' "$1" | tr -d ' ,'; }
"$SLUICE" bench -m "$M" -p 24,40 -n 6 -r 2 -t 1 --json > "$WORK/b1.json" 2>/dev/null || bad "bench t1"
"$SLUICE" bench -m "$M" -p 24,40 -n 6 -r 2 -t 2 --json --evidence-dir "$WORK/ev" \
  --trace-routing "$WORK/bench.trace" > "$WORK/b2.json" 2>/dev/null || bad "bench t2"
"$SLUICE" bench -m "$M" -p 24,40 -n 6 -r 1 -t 2 --json > "$WORK/b3.json" 2>/dev/null || bad "bench again"
check test "$(hashes "$WORK/b1.json" | wc -l)" -eq 8
check test "$(hashes "$WORK/b1.json")" = "$(hashes "$WORK/b2.json")"
# repetitions of one prompt length hash equal, and equal the earlier process's runs
check test "$(hashes "$WORK/b3.json" | sort -u)" = "$(hashes "$WORK/b1.json" | sort -u)"
check test "$(hashes "$WORK/b1.json" | sort -u | wc -l)" -eq 4
# the evidence files are what the record says
for f in "$WORK"/ev/*.logits.f32 "$WORK"/ev/*.tokens.i32; do
  h=$(sha256sum "$f" | cut -d' ' -f1)
  check grep -q "$h" "$WORK/b2.json"
done
check test -s "$WORK/ev/bench.json"
check grep -q '"schema": "sluice-bench/1"' "$WORK/b1.json"
check grep -q '"git_rev"' "$WORK/b1.json"
check grep -q '"mode"' "$WORK/b1.json"
# markdown and CSV reports
check bash -c "'$SLUICE' bench -m '$M' -p 16 -n 4 2>/dev/null | grep -q '^| model |'"
check bash -c "'$SLUICE' bench -m '$M' -p 16 -n 4 --csv 2>/dev/null | grep -q '^model,'"

# routing traces from run and bench, replayed
check "$SLUICE" run -m "$M" -p "Hello there, how are you" -n 8 --temp 0 --trace-routing "$WORK/run.trace" -t 1
check bash -c "'$SLUICE' cachesim '$WORK/run.trace' --sizes 2,4,8,16 | grep -q belady"
check bash -c "'$SLUICE' cachesim '$WORK/bench.trace' --sizes 25%,50% --svg '$WORK/c.svg' | grep -q 'lru-warm'"
check grep -q '<svg' "$WORK/c.svg"
check bash -c "'$SLUICE' cachesim '$WORK/bench.trace' --seq 1 --csv --no-svg | grep -q '^slots,'"
# expert-parallel balance from the same trace (docs/multi-gpu.md)
check bash -c "'$SLUICE' cachesim '$WORK/run.trace' --ep-ranks 1,2,4 | grep -qE '^\| 4 \| [0-9.]+ \|'"

# perplexity: batch and decode paths agree
yes "The little cat sat on the warm mat and looked at the birds outside the window." | head -n 40 > "$WORK/text.txt"
check bash -c "'$SLUICE' perplexity -m '$M' -f '$WORK/text.txt' -c 64 --decode -t 2 2>/dev/null | grep -q 'relative difference 0'"

# bench --mtp-accept (measurement): at acceptance 1 every draft is the plain run's token, so
# every drafted token is accepted, and the evidence equals plain decoding's
X=$WORK/q4x-mtp.gguf
check "$SLUICE" synth -q --preset qwen4exp-tiny --type Q4_K_M --mtp -o "$X"
"$SLUICE" bench -m "$X" -p 24 -n 12 -r 1 -t 2 --json > "$WORK/m0.json" 2>/dev/null || bad "bench plain (mtp file)"
"$SLUICE" bench -m "$X" -p 24 -n 12 -r 1 -t 2 --json --mtp 2 --mtp-always --mtp-accept 1 > "$WORK/m1.json" 2>/dev/null ||
  bad "bench --mtp-accept 1"
check test "$(hashes "$WORK/m0.json")" = "$(hashes "$WORK/m1.json")"
drafted=$(grep -o '"drafted": [0-9]*' "$WORK/m1.json" | grep -o '[0-9]*$')
accepted=$(grep -o '"accepted": [0-9]*' "$WORK/m1.json" | grep -o '[0-9]*$')
check test "${drafted:-0}" -gt 0 -a "${drafted:-0}" = "${accepted:-x}"
one_line_error "$SLUICE" bench -m "$X" -p 8 -n 2 --mtp 1 --mtp-accept 1.5
one_line_error "$SLUICE" bench -m "$X" -p 8 -n 2 --mtp-accept 0.5

# bad inputs
# --layers: the preset's per-layer shapes, fewer layers, a name that says so; it runs
check "$SLUICE" synth -q --preset qwen35moe-tiny --layers 1 -o "$WORK/l1.gguf"
check sh -c "'$SLUICE' info '$WORK/l1.gguf' | grep -q 'block_count  *1\$'"
check sh -c "'$SLUICE' info '$WORK/l1.gguf' | grep -q 'synthetic), 1 layer.$'"
check sh -c "'$SLUICE' run -m '$WORK/l1.gguf' -p hi -n 4 -t 1 --temp 0 > /dev/null 2>&1"
one_line_error "$SLUICE" synth --preset qwen3moe-tiny --layers -2 -o "$WORK/x.gguf"
one_line_error "$SLUICE" synth --preset nope -o "$WORK/x.gguf"
one_line_error "$SLUICE" synth --preset qwen3moe-tiny --type Q9_X -o "$WORK/x.gguf"
one_line_error "$SLUICE" synth --preset qwen3moe-tiny -o /nonexistent-dir/x.gguf
printf 'SLTRjunkjunkjunk' > "$WORK/bad.trace"
one_line_error "$SLUICE" cachesim "$WORK/bad.trace"
head -c 60 "$WORK/run.trace" > "$WORK/trunc.trace"
one_line_error "$SLUICE" cachesim "$WORK/trunc.trace"
one_line_error "$SLUICE" cachesim "$WORK/run.trace" --sizes 0,abc
one_line_error "$SLUICE" cachesim "$WORK/run.trace" --ep-ranks 0
one_line_error "$SLUICE" run -m "$M" -p hi -n 2 --gpus 1
one_line_error "$SLUICE" bench -m "$M" -p 0
one_line_error "$SLUICE" bench -m "$M" -p 16 -n 2 --evidence-dir /nonexistent-dir/ev
one_line_error "$SLUICE" run -m "$M" -p hi -n 2 --trace-routing /nonexistent-dir/t.trace
one_line_error "$SLUICE" perplexity -m "$M" -f "$WORK/text.txt" -c 4000

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
