#!/usr/bin/env bash
# Everything the CUDA backend needs from the GPU machine, in one call of the device tool
# (`run`), from the repository root, with .devcarry/ carried (bench/cuda/pack.sh made it):
#
#   bench/cuda/run_h200.sh [STAGES]        STAGES: comma-separated, default "env,test,sanitize"
#
#   env       machine, driver, libraries
#   mini      a small model (qwen35moe-mini): GPU bench with graphs, an eager per-op profile
#   synth     synthetic models into /tmp (tiny ones of every type mix; BIG=1 also the 35B-A3B
#             and 30B-A3B shapes, Q4_K_M; in the background while the next stages run)
#   test      tests/gpu/test_cuda: codecs and ops vs the CPU, then every model (fixtures from
#             tests/data and .devcarry/fixtures, tiny synthetic ones): GPU vs CPU logits and the
#             GPU's bit-identity across resident / streamed / cache sizes / graphs
#   sanitize  compute-sanitizer memcheck on the ops and one model
#   tsynth    test_cuda (quick) on the tiny synthetic models of every type mix
#   big       test_cuda on the 35B-A3B shape (short prompt) and an op profile of it
#   bench     sluice bench --gpu: resident and --gpu-budget 8GiB (copy, zerocopy), both shapes
#   llama     llama.cpp's llama-bench (.devcarry/llama.tar.xz) on the same files
#
# Results go to $OUT (the tool brings back at most 8 files): summary.txt (also printed at the
# end), and logs per stage. Every stage runs under a timeout and a failing stage does not stop
# the others.
set -u
ROOT=$(pwd)
OUT=${OUT:-/tmp/out}
W=/tmp/sl
mkdir -p "$OUT" "$W" /tmp/models
STAGES=${1:-env,synth,test,mini,sanitize,tsynth}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }

tar xJf .devcarry/bin.tar.xz -C "$W"
export LD_LIBRARY_PATH="$W/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
SL=$W/sluice
TC=$W/test_cuda
mkdir -p "$W/vocab" && tar xJf tests/data/tokenizer-vocab.tar.xz -C "$W/vocab"
export SLUICE_VOCAB_DIR=$W/vocab
GOLD=$W/golden
mkdir -p "$GOLD"
cp tests/data/*.prompt.ids "$GOLD/" 2>/dev/null
cp .devcarry/fixtures/*.prompt.ids "$GOLD/" 2>/dev/null
THREADS=$(nproc)
Q35=/tmp/models/q35-35b-a3b-Q4_K_M.gguf
Q30=/tmp/models/q3-30b-a3b-Q4_K_M.gguf

if has env; then
  {
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,power.limit --format=csv
    echo "cores $(nproc)"; free -g; df -h /tmp; grep -m1 'model name' /proc/cpuinfo; uname -r
    cat /etc/os-release | head -2
    ldd "$SL" | grep -i "not found" || echo "all libraries found"
    which compute-sanitizer nvcc; nvcc --version | tail -2
  } > "$OUT/env.txt" 2>&1
  say "env: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader), $(nproc) cores"
  grep -q "not found" "$OUT/env.txt" && say "env: MISSING LIBRARIES: $(grep 'not found' "$OUT/env.txt" | tr '\n' ' ')"
fi

SYNTH_PID=
if has synth; then
  (
    for arch in qwen3moe-tiny qwen35moe-tiny; do
      for t in F32 Q8_0 Q6_K Q2_K IQ4_XS Q2_K_XL F16 BF16; do
        "$SL" synth --preset $arch --type $t -o /tmp/models/synth-$arch-$t.gguf -q -t 4 || echo "synth $arch $t failed"
      done
    done
    "$SL" synth --preset qwen3next-tiny --type Q4_K_M -o /tmp/models/synth-qwen3next-tiny-Q4_K_M.gguf -q -t 4
    "$SL" synth --preset qwen35moe-mini --type Q4_K_M -o /tmp/models/mini-qwen35moe-Q4_K_M.gguf -q -t 8
    if [ -n "${BIG:-}" ]; then
      [ -f "$Q35" ] || "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M -o "$Q35" -q -t "$THREADS"
      [ -n "${BIG30:-}" ] && { [ -f "$Q30" ] || "$SL" synth --preset qwen3moe-30b-a3b --type Q4_K_M -o "$Q30" -q -t "$THREADS"; }
    fi
  ) > "$OUT/synth.log" 2>&1 &
  SYNTH_PID=$!
  # the tiny ones first (a few seconds), the tests want them
  for i in $(seq 90); do [ -f /tmp/models/synth-qwen3next-tiny-Q4_K_M.gguf ] && break; sleep 1; done
  say "synth: tiny models ready ($(ls /tmp/models/synth-*.gguf 2>/dev/null | wc -l))"
fi

if has test; then
  MODELS=(tests/data/qwen3moe-tiny-Q4_K_M.gguf tests/data/qwen35moe-tiny-Q4_K_M.gguf models/stories260K.gguf)
  for f in .devcarry/fixtures/*.gguf; do [ -f "$f" ] && MODELS+=("$f"); done
  timeout 240 "$TC" --golden "$GOLD" "${MODELS[@]}" > "$OUT/test_cuda.log" 2>&1
  rc=$?
  say "test_cuda (fixtures): rc=$rc; $(tail -1 "$OUT/test_cuda.log")"
  grep -E "^FAIL|GPU vs CPU|^== [a-z]" "$OUT/test_cuda.log" | head -60 >> "$OUT/summary.txt"
fi

if has mini; then
  for i in $(seq 120); do [ -f /tmp/models/mini-qwen35moe-Q4_K_M.gguf ] && break; sleep 1; done
  MINI=/tmp/models/mini-qwen35moe-Q4_K_M.gguf
  if [ -f "$MINI" ]; then
    timeout 90 "$SL" bench -m "$MINI" --gpu -p 512 -n 64 -r 1 > "$OUT/mini.log" 2>&1
    say "mini bench (graphs): rc=$?"; grep -E "^\|" "$OUT/mini.log" | tail -3 >> "$OUT/summary.txt"
    timeout 90 "$SL" bench -m "$MINI" --gpu --gpu-profile -p 512 -n 16 -r 1 --no-warmup >> "$OUT/mini.log" 2>&1
    say "mini profile (eager, per op): rc=$?"
    sed -n '/CUDA op profile/,/| total/p' "$OUT/mini.log" >> "$OUT/summary.txt"
  fi
fi

if has sanitize; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    "$TC" --quick --ops-only > "$OUT/sanitize.log" 2>&1
  rc1=$?
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    "$TC" --quick --ops-skip --golden "$GOLD" --prompt 24 tests/data/qwen35moe-tiny-Q4_K_M.gguf >> "$OUT/sanitize.log" 2>&1
  rc2=$?
  say "compute-sanitizer memcheck: ops rc=$rc1, model rc=$rc2; $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tr '\n' ' ')"
fi

if has tsynth; then
  SYN=(/tmp/models/synth-*.gguf)
  timeout 150 "$TC" --quick --ops-skip "${SYN[@]}" > "$OUT/test_synth.log" 2>&1
  rc=$?
  say "test_cuda (synthetic tiny, every type mix): rc=$rc; $(tail -1 "$OUT/test_synth.log")"
  grep -E "^FAIL|GPU vs CPU|^== [a-z]" "$OUT/test_synth.log" | head -60 >> "$OUT/summary.txt"
fi

wait_big() {
  [ -n "$SYNTH_PID" ] && wait "$SYNTH_PID"
  SYNTH_PID=
  ls -la /tmp/models/*.gguf | grep -v synth- >> "$OUT/summary.txt" 2>/dev/null
}

if has big; then
  wait_big
  if [ -f "$Q35" ]; then
    timeout 300 "$TC" --quick --prompt 12 "$Q35" > "$OUT/big.log" 2>&1
    say "test_cuda 35B: rc=$?"
    grep -E "^FAIL|GPU|^== " "$OUT/big.log" >> "$OUT/summary.txt"
    timeout 120 "$SL" bench -m "$Q35" --gpu --gpu-profile -p 512 -n 32 -r 1 --no-warmup >> "$OUT/big.log" 2>&1
    say "profile 35B (prefill 512, decode 32, eager ops): rc=$?"
    sed -n '/CUDA op profile/,/| total/p' "$OUT/big.log" >> "$OUT/summary.txt"
  fi
fi

bench_one() { # label, args...
  local label=$1; shift
  local t0=$(date +%s)
  timeout 300 "$SL" bench "$@" > "$OUT/bench-tmp.txt" 2>&1
  local rc=$?
  cat "$OUT/bench-tmp.txt" >> "$OUT/bench.log"
  say "bench $label ($(($(date +%s) - t0))s, rc=$rc): sluice bench $*"
  grep -E "^\|" "$OUT/bench-tmp.txt" | tail -4 >> "$OUT/summary.txt"
}

if has bench; then
  wait_big
  for m in "$Q35" "$Q30"; do
    [ -f "$m" ] || continue
    bench_one "resident" -m "$m" --gpu -p 2048 -n 128 -r 2 -b 2048
    bench_one "8GiB copy" -m "$m" --gpu --gpu-budget 8GiB -p 2048 -n 64 -r 1 -b 2048
    bench_one "8GiB zerocopy" -m "$m" --gpu --gpu-budget 8GiB --gpu-miss zerocopy -p 512 -n 64 -r 1
  done
fi

if has llama && [ -f .devcarry/llama.tar.xz ]; then
  wait_big
  mkdir -p "$W/llama" && tar xJf .devcarry/llama.tar.xz -C "$W/llama"
  LB=$W/llama/bin/llama-bench
  export LD_LIBRARY_PATH="$W/llama/bin:$LD_LIBRARY_PATH"
  ldd "$LB" | grep "not found" >> "$OUT/summary.txt"
  for m in "$Q35" "$Q30"; do
    [ -f "$m" ] || continue
    t0=$(date +%s)
    timeout 200 "$LB" -m "$m" -ngl 99 -fa 1 -p 2048 -n 128 -r 2 -o md > "$OUT/llama-tmp.txt" 2>&1
    say "llama-bench resident ($(($(date +%s) - t0))s, rc=$?): -m $(basename "$m") -ngl 99 -fa 1 -p 2048 -n 128 -r 2"
    grep -E "^\|" "$OUT/llama-tmp.txt" >> "$OUT/summary.txt"; cat "$OUT/llama-tmp.txt" >> "$OUT/llama.log"
    t0=$(date +%s)
    timeout 200 "$LB" -m "$m" -ngl 99 -fa 1 -ncmoe 26 -p 2048 -n 64 -r 1 -o md > "$OUT/llama-tmp.txt" 2>&1
    say "llama-bench -ncmoe 26 ($(($(date +%s) - t0))s, rc=$?): -m $(basename "$m") -ngl 99 -fa 1 -ncmoe 26 -p 2048 -n 64 -r 1"
    grep -E "^\|" "$OUT/llama-tmp.txt" >> "$OUT/summary.txt"; cat "$OUT/llama-tmp.txt" >> "$OUT/llama.log"
  done
fi

[ -n "$SYNTH_PID" ] && kill "$SYNTH_PID" 2>/dev/null
rm -f "$OUT/bench-tmp.txt" "$OUT/llama-tmp.txt"
say "done"
cat "$OUT/summary.txt"
