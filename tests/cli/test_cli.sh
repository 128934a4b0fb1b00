#!/usr/bin/env bash
# End-to-end checks of the sluice command line: the embedded model's story, tokenize/logits
# output formats, and clean one-line errors with the right exit codes on bad input.
set -u
SLUICE=$1
DATA=$2      # tests/data
MODELS=$3    # models/
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
check() { # name, condition result
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
expect_exit() { # name, expected status, command...
  local name=$1 want=$2; shift 2
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [ "$got" -eq "$want" ] && [ -s "$work/err" ] && [ "$lines" -le 1 ]; then
    echo "ok   $name (exit $got: $(cat "$work/err"))"
  else
    echo "FAIL $name: exit $got (want $want), stderr: $(cat "$work/err")"
    fail=1
  fi
}

# 1. the embedded default model (sluice-moe-tiny) runs with no arguments, deterministically
"$SLUICE" run -n 48 --temp 0 >"$work/story" 2>"$work/story.err"
check "embedded model runs" $?
grep -q "^In the beginning" "$work/story" && [ "$(wc -c <"$work/story")" -gt 80 ]; check "embedded model writes text after its prompt" $?
grep -q "generation 48 tokens, [0-9.]* tokens/s" "$work/story.err"; check "speed on stderr" $?
"$SLUICE" run -n 48 --temp 0 -t 1 >"$work/story1" 2>/dev/null
cmp -s "$work/story" "$work/story1"; check "embedded model: same text with 1 thread" $?

# the embedded model is a trained model: perplexity on held-out KJV text (measured 19.9; a broken
# codec, tokenizer or forward pass gives hundreds)
ppl=$("$SLUICE" perplexity -f "$DATA/kjv-heldout.txt" 2>&1 | sed -n 's/.*PPL = \([0-9.]*\).*/\1/p')
awk -v p="$ppl" 'BEGIN { exit !(p > 0 && p < 25) }'; check "embedded model perplexity $ppl < 25" $?

# 2. explicit model and prompt: stdout is exactly the generated text (stories260K's published
# greedy story)
"$SLUICE" run -m "$MODELS/stories260K.gguf" -p "Once upon a time" -n 64 --temp 0 -t 1 >"$work/gen" 2>/dev/null
printf '%s\n' "$(cat "$DATA/stories260K.greedy.txt")" >"$work/gen.want"
cmp -s "$work/gen" "$work/gen.want"; check "run -m -p greedy text" $?

# 3. seeded sampling is reproducible
"$SLUICE" run -n 40 --seed 7 >"$work/s1" 2>/dev/null
"$SLUICE" run -n 40 --seed 7 -t 1 >"$work/s2" 2>/dev/null
[ -s "$work/s1" ]; check "seeded sampling prints text" $?
cmp -s "$work/s1" "$work/s2"; check "same seed, same text (1 vs all threads)" $?

# 4. tokenize --ids prints [a, b, c] equal to llama.cpp's ids
want="[$(sed 's/ /, /g' "$DATA/qwen3moe-tiny-F32.prompt.ids" | tr -d '\n')]"
got=$("$SLUICE" tokenize -m "$DATA/qwen3moe-tiny-Q4_K_M.gguf" -f "$DATA/prompt.txt" --ids)
[ "$got" = "$want" ]; check "tokenize --ids (qwen2 BPE)" $?
got=$("$SLUICE" tokenize -m "$DATA/qwen3moe-tiny-Q4_K_M.gguf" -p "<|im_start|>user" --ids)
[ "$got" = "[2046, 872]" ] || [ "${got#\[2046, }" != "$got" ]; check "tokenize parses special tokens" $?
got=$("$SLUICE" tokenize -m "$DATA/qwen3moe-tiny-Q4_K_M.gguf" -p "<|im_start|>" --ids --no-parse-special)
[ "${got#\[2046}" = "$got" ]; check "tokenize --no-parse-special" $?
got=$("$SLUICE" tokenize -m "$MODELS/stories260K.gguf" -f "$DATA/stories260K.prompt.txt" --ids)
[ "$got" = "[$(sed 's/ /, /g' "$DATA/stories260K.prompt.ids" | tr -d '\n')]" ]; check "tokenize adds BOS when the metadata asks (SPM)" $?

# 5. logits: [tokens][vocab] float32, same from text and from ids, any thread count
"$SLUICE" logits -m "$MODELS/stories260K.gguf" -p "Once upon a time" -o "$work/a.f32" 2>/dev/null
"$SLUICE" logits -m "$MODELS/stories260K.gguf" --ids "$(cat "$DATA/stories260K.prompt.ids")" -t 1 -o "$work/b.f32" 2>/dev/null
[ "$(stat -c %s "$work/a.f32")" -eq $((5 * 512 * 4)) ]; check "logits file size" $?
cmp -s "$work/a.f32" "$work/b.f32"; check "logits from text == from ids, 1 vs all threads" $?

# 6. errors: one line on stderr, exit 1 (runtime) or 2 (usage)
expect_exit "missing model file" 1 "$SLUICE" run -m "$work/none.gguf" -p hi
head -c 1000 "$MODELS/stories260K.gguf" >"$work/trunc.gguf"
expect_exit "truncated GGUF" 1 "$SLUICE" run -m "$work/trunc.gguf" -p hi
expect_exit "truncated GGUF (info)" 1 "$SLUICE" info "$work/trunc.gguf"
printf 'not a model at all' >"$work/junk.gguf"
expect_exit "not a GGUF" 1 "$SLUICE" tokenize -m "$work/junk.gguf" -p hi
expect_exit "bad number" 2 "$SLUICE" run --temp abc
expect_exit "negative -n" 2 "$SLUICE" run -n -1
expect_exit "unknown option" 2 "$SLUICE" run --bogus
expect_exit "unknown command" 2 "$SLUICE" frobnicate
expect_exit "token id out of range" 1 "$SLUICE" logits -m "$MODELS/stories260K.gguf" --ids "1 99999" -o "$work/x.f32"
[ ! -e "$work/x.f32" ] && [ ! -e "$work/x.f32.tmp" ]; check "no partial logits file after an error" $?
expect_exit "unwritable output" 1 "$SLUICE" logits -m "$MODELS/stories260K.gguf" -p hi -o /nonexistent/dir/x.f32
expect_exit "context too small" 1 "$SLUICE" run -m "$MODELS/stories260K.gguf" -p "Once upon a time" -c 2

# 7. memory plan flags, repack and verify
Q4="$DATA/qwen3moe-tiny-Q4_K_M.gguf"
"$SLUICE" run -m "$Q4" --plan >"$work/plan" 2>&1; check "--plan exits 0" $?
grep -q "^plan: resident" "$work/plan"; check "--plan prints the table" $?
"$SLUICE" logits -m "$Q4" --plan --json --stream >"$work/plan.json"; check "--plan --json exits 0" $?
grep -q '"mode":"stream"' "$work/plan.json" && grep -q '"floor_slots":5' "$work/plan.json"; check "plan JSON" $?
expect_exit "--cache below the floor" 1 "$SLUICE" run -m "$Q4" -p hi -n 1 --cache 3x
expect_exit "budget below the floor" 1 "$SLUICE" run -m "$Q4" -p hi -n 1 --stream --mem-budget 100M
expect_exit "--resident with --stream" 2 "$SLUICE" run -m "$Q4" -p hi --resident --stream
expect_exit "bad --io" 2 "$SLUICE" run -m "$Q4" -p hi --io fast
expect_exit "bad --cache" 2 "$SLUICE" run -m "$Q4" -p hi --cache lots
expect_exit "bad --gpu-miss" 2 "$SLUICE" run -m "$Q4" -p hi --gpu --gpu-miss maybe
expect_exit "--gpu-miss without --gpu" 2 "$SLUICE" run -m "$Q4" -p hi --gpu-miss host
expect_exit "--gpu-host-experts without --gpu-miss host" 2 "$SLUICE" run -m "$Q4" -p hi --gpu --gpu-host-experts 2
expect_exit "negative --gpu-host-experts" 2 "$SLUICE" run -m "$Q4" -p hi --gpu --gpu-miss host --gpu-host-experts -1
expect_exit "negative --mtp-vocab" 2 "$SLUICE" run -m "$Q4" -p hi --mtp 1 --mtp-vocab -5
expect_exit "negative --mtp-vocab (bench)" 2 "$SLUICE" bench -m "$Q4" --mtp 1 --mtp-vocab -5
"$SLUICE" run -m "$Q4" -p "Hello" -n 12 --temp 0 >"$work/res.txt" 2>/dev/null
"$SLUICE" run -m "$Q4" -p "Hello" -n 12 --temp 0 --cache 5x --no-prefetch >"$work/str.txt" 2>/dev/null
cmp -s "$work/res.txt" "$work/str.txt"; check "streamed run prints the resident text" $?
"$SLUICE" repack -q "$Q4" "$work/store.gguf"; check "repack" $?
"$SLUICE" verify -q "$work/store.gguf" | grep -q "expert-major store OK"; check "verify a store" $?
"$SLUICE" verify -q "$Q4" | grep -q "plain GGUF"; check "verify a plain file" $?
"$SLUICE" run -m "$work/store.gguf" -p "Hello" -n 12 --temp 0 --stream --verify-reads >"$work/st2.txt" 2>/dev/null
cmp -s "$work/res.txt" "$work/st2.txt"; check "the store streams the same text" $?
expect_exit "repack a store again" 1 "$SLUICE" repack -q "$work/store.gguf" "$work/again.gguf"
expect_exit "repack a missing file" 1 "$SLUICE" repack -q "$work/none.gguf" "$work/x.gguf"
# outputs are written beside the target and renamed over it: a target that is no regular file
# (a pipe here; /dev/null as root) is refused instead of being replaced
mkfifo "$work/pipe"
expect_exit "logits into a pipe" 1 "$SLUICE" logits -m "$MODELS/stories260K.gguf" -p hi -o "$work/pipe"
expect_exit "repack into a pipe" 1 "$SLUICE" repack -q "$Q4" "$work/pipe"
expect_exit "synth into a pipe" 1 "$SLUICE" synth --preset qwen3moe-tiny --type Q8_0 -q -o "$work/pipe"
expect_exit "synth into a directory" 1 "$SLUICE" synth --preset qwen3moe-tiny --type Q8_0 -q -o "$work"
[ -p "$work/pipe" ]; check "the pipe is still a pipe" $?

# 8. help documents every flag of every command
"$SLUICE" --help >"$work/help" && grep -q "run" "$work/help"; check "sluice --help" $?
for cmd in $("$SLUICE" --help | awk '/^commands:/{f=1;next} f && !NF {f=0} f {print $1}'); do
  "$SLUICE" "$cmd" --help >"$work/h.$cmd" 2>&1; check "sluice $cmd --help" $?
done
exit $fail
