#!/usr/bin/env bash
# Everything the CUDA backend needs from the GPU machine, in one call of the device tool
# (`run`), from the repository root, with .devcarry/ carried (bench/cuda/pack.sh made it):
#
#   bench/cuda/run_h200.sh [STAGES]      STAGES: comma-separated (default: env,synth,test,ep,mini)
#
#   env       machine, driver, libraries
#   synth     synthetic models into /tmp/models in the background: tiny ones of every type mix,
#             qwen35moe-mini; with BIG=1 also the 35B-A3B (qwen35moe) and 30B-A3B (qwen3moe)
#             shapes as Q4_K_M (the issue's benchmark files)
#   test      tests/gpu/test_cuda: codecs and ops vs the CPU (one process), then each fixture
#             (tests/data, stories260K, .devcarry/fixtures; one process each): GPU vs CPU logits
#             and the GPU's bit-identity across resident / streamed / cache sizes / graphs.
#             A failure of the ops check turns the warp router off for the stages after it
#   ep        tests/gpu/test_ep: expert parallelism over NCCL on one rank (docs/multi-gpu.md):
#             the device dispatch plan vs the CPU's, the EP moe_experts vs the plain op, and
#             the tiny fixtures with and without --gpus 1, all bit for bit. NCCL is opened at
#             run time: SLUICE_NCCL_LIB, else the first libnccl.so.2 found (PyTorch's wheel)
#   tsynth    test_cuda --quick on each tiny synthetic model (every type mix)
#   mini      qwen35moe-mini: bench with and without graphs, an eager per-op profile
#   sanitize  compute-sanitizer memcheck: the ops, and one model with every store mode
#   big       test_cuda --big on the 35B-A3B shape, and its per-op profile
#   bench     sluice bench --gpu: resident pp2048+tg128 on both shapes; --gpu-budget 8GiB with
#             misses copied and read in place on the 35B-A3B shape
#   stream    the issue's small-VRAM comparison: the 35B-A3B shape uniformly routed and with
#             --routing-skew 1 (both synthesized in the background from the start, /tmp/models),
#             sluice bench --gpu --gpu-budget 8GiB with misses copied and read in place (decode
#             and pp512, pp2048), and resident for the evidence hashes (equal bits whatever the mode);
#             STREAM_NO_SKEW=1: the uniform file only
#   hostbench the host's copy of the GPU's expert products alone (bench_kernels --device-rows,
#             1 / 8 / 16 threads, experts from the last-level cache and from DRAM)
#   host      --gpu-miss host on the uniform 35B-A3B shape (synthesized in the background): resident
#             and copy for reference, then HOST_CONFIGS (default "4 8 4:2 8:2": N or N:L for
#             --gpu-host-experts N with SLUICE_GPU_LOOK_MAX=L lookahead copies a layer)
#   eager     resident decode of the 35B-A3B shape without CUDA graphs (the host's launch cost)
#   copy2     copy-mode decode (--gpu-budget 8GiB, p512+n64) twice on each 35B-A3B file, with
#             SLUICE_MOE_TIMING's host breakdown
#   sab       streamed decode A/B/A on each 35B-A3B file (skewed first): --gpu-miss SAB_MISS (default
#             copy), --gpu-budget 8GiB, p512+n64, SLUICE_MOE_TIMING's breakdown; SAB_ENV="VAR=1
#             ...[;VAR2=1 ...]": each ';'-separated set of variables once, with a default run before
#             the first and after each
#   stream30  the same for the 30B-A3B shape (uniform): --gpu-budget 8GiB copy and zero-copy decode, pp2048,
#             resident for the hashes; with llama, llama.cpp -ncmoe 29 (about 8 GiB of VRAM)
#   pprof     prefill per-op profile (--gpu-profile: eager, events around every op) of pp2048 on
#             both shapes, resident (synthesized in the background from the start); PPROF_ENV=
#             "VAR=1 ...[;VAR2=1 ...]" also times pp2048 and decode with each ';'-separated set of
#             variables, then decode without them once more (an A/B/A in one call)
#   ktrace    kernel trace of the decode graph (sluice-ktrace from KTRACE=1 pack.sh): per kernel,
#             the time from its start to the next one's, on both shapes (src/backends/cuda/cuda_ktrace.cu);
#             KTRACE_ENV="VAR=1 ...[;VAR2=1 ...]": one more trace per ';'-separated set of variables
#   ncuk      Nsight Compute's detail (speed of light, memory, warp states, occupancy) of single
#             decode kernels of the 35B-A3B shape, eager: the output head (the one Q6_K one-token
#             full-warp product of a step) and the first layer's expert gate/up and down launches;
#             NCUK_ENV="VAR=1 ...": the head and the expert launches once more with these variables
#   quick35   the least device time for one side-by-side number: the 35B-A3B shape alone,
#             synthesized in the background from the start, then sluice bench --gpu and
#             llama.cpp's llama-bench -ngl 99 (-fa off) at pp512 + tg64, one repetition each
#   prof      the 35B-A3B shape cut to 4 layers (synth --layers 4: 3 Gated DeltaNet + 1 attention
#             layer, the real per-layer shapes): decode TPOT with graphs, llama.cpp on the same
#             file, and Nsight Compute's duration of every kernel of 3 eager decode steps
#             (ncu.csv; bench/cuda/ncu_steps.py sums it per kernel name)
#   waitsynth wait for the background synth (BIG=1) before returning, so that a following call
#             on the still-warm machine finds the benchmark files
#   hfref     tools/hf_reference.py with transformers on this machine's CPU (HFREF_ARGS, default
#             --only qwen4exp): the converter tests' reference models and logits, as hfref.tgz
#   llama     llama.cpp's llama-bench (.devcarry/llama.tar.xz) on the same files: resident
#             (-ngl 99) and -ncmoe 26 (also on the skewed file when it exists); the carried build
#             has no flash-attention kernels (the transfer limit), so -fa off. With the repo's
#             test data the tree, bin.tar.xz and llama.tar.xz no longer fit one call (64 MiB):
#             carry bin.tar.xz in one call, llama.tar.xz in the next on the warm machine (the
#             unpacked sluice in /tmp/sl stays). LLAMA_RESIDENT_ONLY=1: the resident runs only.
#             Without models/sluice-moe-tiny.gguf in the tree (moved aside for the call) both
#             archives fit one call
#
# Results go to $OUT (the tool brings back at most 8 files): summary.txt (also printed at the
# end) and a log per stage. Every step runs under a timeout; a failing step does not stop the
# others.
set -u
ulimit -c 0 # a crashing CUDA process must not spend minutes writing a core file
ROOT=$(pwd)
OUT=${OUT:-/tmp/out}
W=/tmp/sl
mkdir -p "$OUT" "$W" /tmp/models
STAGES=${1:-env,synth,test,ep,mini}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }

[ -f .devcarry/bin.tar.xz ] && tar xJf .devcarry/bin.tar.xz -C "$W"
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
MINI=/tmp/models/mini-qwen35moe-Q4_K_M.gguf
Q35Z=/tmp/models/q35-35b-a3b-z1-Q4_K_M.gguf

if has env; then
  {
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,power.limit --format=csv
    echo "cores $(nproc)"; free -g; df -h /tmp; grep -m1 'model name' /proc/cpuinfo; uname -r
    grep -o -m1 -E 'amx_int8|avx512_bf16|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '
    head -2 /etc/os-release
    ldd "$SL" | grep -i "not found" || echo "all libraries found"
  } > "$OUT/env.txt" 2>&1
  say "env: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader), $(nproc) cores"
fi

SYNTH_PID=
BIGS=() # the full-size files the stream and pprof stages need, synthesized in one background job
has stream && BIGS+=("$Q35")
has host && BIGS+=("$Q35")
has copy2 && BIGS+=("$Q35" "$Q35Z")
has sab && BIGS+=("$Q35Z" "$Q35")
has eager && BIGS+=("$Q35")
has stream && [ -z "${STREAM_NO_SKEW:-}" ] && BIGS+=("$Q35Z")
has pprof && BIGS+=("$Q35" "$Q30")
has ktrace && BIGS+=("$Q35" "$Q30")
has ncuk && BIGS+=("$Q35")
has stream30 && BIGS+=("$Q30")
if [ ${#BIGS[@]} -gt 0 ]; then
  ( for f in $(printf '%s\n' "${BIGS[@]}" | awk '!seen[$0]++'); do
      [ -f "$f" ] && continue
      case $f in
        "$Q35") "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M -o "$f" -q -t "$THREADS" ;;
        "$Q35Z") "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M --routing-skew 1 -o "$f" -q -t "$THREADS" ;;
        "$Q30") "$SL" synth --preset qwen3moe-30b-a3b --type Q4_K_M -o "$f" -q -t "$THREADS" ;;
      esac
      sync
    done
    echo "synth done" ) > "$OUT/synth.log" 2>&1 &
  SYNTH_PID=$!
fi
if has quick35; then
  ( "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M -o "$Q35.part" -q -t "$THREADS" &&
    mv "$Q35.part" "$Q35" && sync; echo "synth done" ) > "$OUT/synth.log" 2>&1 &
  SYNTH_PID=$!
fi
if has synth; then
  # The tiny files first, then `sync`: pinning a file for the GPU (stream mode,
  # cudaHostRegister) waits for its dirty pages to be written back, and with a 20 GB file being
  # written behind them that wait looked like a hang (run 2: every tiny synthetic model of a
  # larger type stalled in its first stream-mode load; fixtures, written long before, did not).
  for arch in qwen3moe-tiny qwen35moe-tiny; do
    for t in F32 Q8_0 Q6_K Q2_K IQ4_XS Q2_K_XL F16 BF16; do
      "$SL" synth --preset $arch --type $t -o /tmp/models/synth-$arch-$t.gguf -q -t 4 || echo "synth $arch $t failed"
    done
  done > "$OUT/synth.log" 2>&1
  "$SL" synth --preset qwen3next-tiny --type Q4_K_M -o /tmp/models/synth-qwen3next-tiny-Q4_K_M.gguf -q -t 4 >> "$OUT/synth.log" 2>&1
  sync
  (
    "$SL" synth --preset qwen35moe-mini --type Q4_K_M -o "$MINI" -q -t 8
    sync
    if [ -n "${BIG:-}" ]; then
      [ -f "$Q35" ] || "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M -o "$Q35" -q -t "$THREADS"
      [ -f "$Q30" ] || "$SL" synth --preset qwen3moe-30b-a3b --type Q4_K_M -o "$Q30" -q -t "$THREADS"
    fi
    sync
    echo "synth done"
  ) >> "$OUT/synth.log" 2>&1 &
  SYNTH_PID=$!
  for i in $(seq 90); do [ -f /tmp/models/synth-qwen3next-tiny-Q4_K_M.gguf ] && break; sleep 1; done
  say "synth: tiny models ready ($(ls /tmp/models/synth-*.gguf 2>/dev/null | wc -l))"
fi

if has test; then
  timeout 120 "$TC" --ops-only > "$OUT/test_cuda.log" 2>&1
  rc=$?
  say "test_cuda ops: rc=$rc; $(tail -1 "$OUT/test_cuda.log")"
  grep -aE "^FAIL" "$OUT/test_cuda.log" | head -30 >> "$OUT/summary.txt"
  if [ $rc -ne 0 ]; then export SLUICE_CUDA_BLOCK_ROUTER=1; say "fallback: block router"; fi
  for f in tests/data/qwen3moe-tiny-Q4_K_M.gguf tests/data/qwen35moe-tiny-Q4_K_M.gguf models/stories260K.gguf \
           .devcarry/fixtures/*.gguf; do
    [ -f "$f" ] || continue
    timeout 60 "$TC" ${QUICK:+--quick} --ops-skip --golden "$GOLD" "$f" >> "$OUT/test_cuda.log" 2>&1
    rc=$?
    say "test_cuda $(basename "$f"): rc=$rc"
  done
  grep -aE "^FAIL|GPU vs CPU|^== [a-z]" "$OUT/test_cuda.log" | head -90 >> "$OUT/summary.txt"
fi

if has ep; then
  if [ -z "${SLUICE_NCCL_LIB:-}" ]; then
    NL=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
    [ -n "$NL" ] || NL=$(find /opt /usr /usr/local -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$NL" ] && export SLUICE_NCCL_LIB=$NL
  fi
  say "ep: NCCL library ${SLUICE_NCCL_LIB:-not found}"
  timeout ${EP_TIMEOUT:-120} "$W/test_ep" tests/data/qwen3moe-tiny-Q4_K_M.gguf tests/data/qwen35moe-tiny-Q4_K_M.gguf \
    > "$OUT/test_ep.log" 2>&1
  rc=$?
  say "test_ep: rc=$rc (0 pass, 1 fail, 2 no NCCL, 77 no GPU); $(tail -1 "$OUT/test_ep.log")"
  grep -aE "^FAIL|DIFFER|EP unavailable|NCCL|expert parallelism|CUDA error|graph capture" "$OUT/test_ep.log" | head -40 >> "$OUT/summary.txt"
  grep -acE "identical" "$OUT/test_ep.log" | sed 's/^/ep: identical results: /' >> "$OUT/summary.txt"
  # the command line: bench's evidence hashes (logits and tokens of every run) with and without
  # --gpus 1 must be equal; the tok/s show what the NCCL round trips cost per MoE layer
  hs() { grep -E '"(logits|tokens)_sha256"' "$1" | tr -d ' ,'; }
  for f in tests/data/qwen35moe-tiny-Q4_K_M.gguf "$MINI"; do
    [ -f "$f" ] || continue
    timeout 90 "$SL" bench -m "$f" --gpu -p 128 -n 64 -r 1 --json > "$W/ep-plain.json" 2>> "$OUT/test_ep.log"
    r1=$?
    timeout 90 "$SL" bench -m "$f" --gpu --gpus 1 -p 128 -n 64 -r 1 --json > "$W/ep-ep.json" 2>> "$OUT/test_ep.log"
    r2=$?
    same=no; [ -n "$(hs "$W/ep-plain.json")" ] && [ "$(hs "$W/ep-plain.json")" = "$(hs "$W/ep-ep.json")" ] && same=yes
    say "ep bench $(basename "$f"): rc=$r1/$r2, evidence hashes equal: $same"
    for j in plain ep; do
      echo "  $j: $(grep -oE '"(prefill|decode)_tps": *[0-9.]+' "$W/ep-$j.json" | tr '\n' ' ')" >> "$OUT/summary.txt"
    done
  done
fi

if has tsynth; then
  for f in ${TSYNTH:-/tmp/models/synth-*.gguf}; do
    timeout ${TSYNTH_TIMEOUT:-60} "$TC" --quick --ops-skip "$f" >> "$OUT/test_synth.log" 2>&1
    rc=$?
    say "test_cuda (quick) $(basename "$f"): rc=$rc"
  done
  grep -aE "^FAIL|GPU vs CPU|^== [a-z]|    run:|prompt evaluated|CUDA error|sluice:" "$OUT/test_synth.log" | tail -60 >> "$OUT/summary.txt"
fi

if has mini; then
  for i in $(seq 120); do [ -f "$MINI" ] && break; sleep 1; done
  sync "$MINI" 2>/dev/null || sync
  if [ -f "$MINI" ]; then
    timeout 90 "$SL" bench -m "$MINI" --gpu -p 512 -n 64 -r 1 > "$OUT/mini.log" 2>&1
    say "mini bench (graphs): rc=$?"; grep -E "^\| q" "$OUT/mini.log" | tail -1 >> "$OUT/summary.txt"
    timeout 90 "$SL" bench -m "$MINI" --gpu --no-graph -p 128 -n 32 -r 1 >> "$OUT/mini.log" 2>&1
    say "mini bench (no graphs): rc=$?"; grep -E "^\| q" "$OUT/mini.log" | tail -1 >> "$OUT/summary.txt"
    if [ -n "${PROFILE:-}" ]; then
      timeout 90 "$SL" bench -m "$MINI" --gpu --gpu-profile -p 512 -n 16 -r 1 --no-warmup >> "$OUT/mini.log" 2>&1
      say "mini profile (eager, per op): rc=$?"
      sed -n '/CUDA op profile/,/| total/p' "$OUT/mini.log" >> "$OUT/summary.txt"
    fi
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

if has prof; then
  P4=/tmp/models/q35-4l-Q4_K_M.gguf
  "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M --layers 4 -o "$P4" -q -t "$THREADS" > "$OUT/prof.log" 2>&1
  sync
  P1=/tmp/models/q35-1l-Q4_K_M.gguf
  "$SL" synth --preset qwen35moe-35b-a3b --type Q4_K_M --layers 1 -o "$P1" -q -t "$THREADS" >> "$OUT/prof.log" 2>&1
  sync
  # SLUICE_CUDA_GRAPH_TIMING: the graph's device time per step against the whole step's
  for f in "$P1" "$P4"; do
    SLUICE_CUDA_GRAPH_TIMING=1 timeout 100 "$SL" bench -m "$f" --gpu -p 512 -n 128 -r 2 > "$W/prof-tmp.log" 2>&1
    say "prof sluice $(basename "$f") (graphs): rc=$?"; cat "$W/prof-tmp.log" >> "$OUT/prof.log"
    grep -E "^\| Q|graph replays" "$W/prof-tmp.log" | tail -3 >> "$OUT/summary.txt"
  done
  # programmatic dependent launch off (SLUICE_CUDA_NO_PDL): what it saves per step
  SLUICE_CUDA_NO_PDL=1 SLUICE_CUDA_GRAPH_TIMING=1 timeout 100 "$SL" bench -m "$P4" --gpu -p 512 -n 128 -r 2 > "$W/prof-tmp.log" 2>&1
  say "prof sluice 4-layer (graphs, no PDL): rc=$?"; cat "$W/prof-tmp.log" >> "$OUT/prof.log"
  grep -E "^\| Q|graph replays" "$W/prof-tmp.log" | tail -3 >> "$OUT/summary.txt"
  timeout 100 "$SL" bench -m "$P4" --gpu --no-graph -p 512 -n 128 -r 1 >> "$OUT/prof.log" 2>&1
  say "prof sluice 4-layer (no graphs): rc=$?"; grep -E "^\| Q" "$OUT/prof.log" | tail -1 >> "$OUT/summary.txt"
  if [ -f .devcarry/llama.tar.xz ]; then
    mkdir -p "$W/llama" && tar xJf .devcarry/llama.tar.xz -C "$W/llama"
    LD_LIBRARY_PATH="$W/llama/bin:$LD_LIBRARY_PATH" timeout 100 "$W/llama/bin/llama-bench" -m "$P4" \
      -ngl 99 -fa off -p 512 -n 128 -r 2 -o md >> "$OUT/prof.log" 2>&1
    say "prof llama.cpp 4-layer: rc=$?"; grep -E "^\| .*(pp512|tg128)" "$OUT/prof.log" >> "$OUT/summary.txt"
  fi
  if [ -n "${NCU:-1}" ] && command -v ncu >/dev/null; then
    # prompt of 1 token, 3 decode steps, eager: every kernel of 4 forward passes
    # NCU_MORE=1: also DRAM bytes, achieved occupancy and registers, with the caches flushed
    # before every kernel (in a real step no layer's weights are in L2 either)
    M=gpu__time_duration.sum CC=none
    [ -n "${NCU_MORE:-}" ] && M=$M,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread CC=all
    timeout 240 ncu --clock-control none --cache-control $CC --metrics $M --csv \
      --log-file "$OUT/ncu.csv" "$SL" bench -m "$P4" --gpu --no-graph --no-warmup -p 1 -n 3 -r 1 \
      > "$OUT/ncu-run.log" 2>&1
    say "prof ncu: rc=$? ($(grep -c gpu__time_duration "$OUT/ncu.csv" 2>/dev/null) kernels)"
  fi
fi

if has hfref; then
  rm -rf "$W/hfref"
  PYTHONUNBUFFERED=1 timeout 300 python3 tools/hf_reference.py "$W/hfref" ${HFREF_ARGS:---only qwen4exp} > "$OUT/hfref.log" 2>&1
  rc=$?
  tar czf "$OUT/hfref.tgz" -C "$W/hfref" . 2>> "$OUT/hfref.log"
  say "hfref: rc=$rc; $(ls "$W/hfref" 2>/dev/null | tr '\n' ' ')"
  tail -5 "$OUT/hfref.log" >> "$OUT/summary.txt"
fi

wait_for() { # FILE: wait until the background synth has finished (every file written back)
  # no synth in this call: the file is from an earlier call on the same (warm) machine
  [ -z "$SYNTH_PID" ] && { [ -f "$1" ]; return; }
  for i in $(seq 400); do
    grep -q "synth done" "$OUT/synth.log" 2>/dev/null && break
    sleep 1
  done
  [ -f "$1" ]
}

if has big; then
  wait_for "$Q35"
  if [ -f "$Q35" ]; then
    timeout 150 "$TC" --big --ops-skip --prompt 12 "$Q35" > "$OUT/big.log" 2>&1
    rc=$?
    say "test_cuda --big 35B-A3B: rc=$rc"
    grep -aE "^FAIL|GPU|^== [a-z]" "$OUT/big.log" >> "$OUT/summary.txt"
    if [ -n "${PROFILE:-}" ]; then
      timeout 120 "$SL" bench -m "$Q35" --gpu --gpu-profile -p 512 -n 16 -r 1 --no-warmup >> "$OUT/big.log" 2>&1
      say "profile 35B-A3B (prefill 512, decode 16, eager ops): rc=$?"
      sed -n '/CUDA op profile/,/| total/p' "$OUT/big.log" >> "$OUT/summary.txt"
    fi
  fi
fi

bench_one() { # label, args...
  local label=$1; shift
  local t0=$(date +%s)
  timeout ${BENCH_TIMEOUT:-150} "$SL" bench "$@" > "$OUT/bench-tmp.txt" 2>&1
  local rc=$?
  cat "$OUT/bench-tmp.txt" >> "$OUT/bench.log"
  say "sluice $label ($(($(date +%s) - t0))s, rc=$rc): sluice bench $*"
  grep -E "^\| [qQ]" "$OUT/bench-tmp.txt" | tail -2 >> "$OUT/summary.txt"
}

if has bench; then
  wait_for "$Q35" && bench_one "35B resident" -m "$Q35" --gpu -p 2048 -n 128 -r 1 -b 2048
  [ -f "$Q35" ] && bench_one "35B 8GiB copy" -m "$Q35" --gpu --gpu-budget 8GiB -p 2048 -n 64 -r 1 -b 2048
  [ -f "$Q35" ] && bench_one "35B 8GiB zerocopy" -m "$Q35" --gpu --gpu-budget 8GiB --gpu-miss zerocopy -p 512 -n 64 -r 1
  wait_for "$Q30" && bench_one "30B resident" -m "$Q30" --gpu -p 2048 -n 128 -r 1 -b 2048
  ls -la /tmp/models/ | grep -v synth- >> "$OUT/summary.txt"
fi

if has stream; then
  for f in "$Q35" $([ -z "${STREAM_NO_SKEW:-}" ] && echo "$Q35Z"); do
    wait_for "$f" || { say "stream: $(basename "$f") missing"; continue; }
    n=$(basename "$f" .gguf)
    [ "$f" = "$Q35" ] && "$SL" bench -m "$f" --gpu --gpu-budget 8GiB --plan >> "$OUT/summary.txt" 2>&1
    [ "$f" = "$Q35" ] && bench_one "$n resident decode" -m "$f" --gpu -p 16 -n 128 -r 2
    bench_one "$n resident" -m "$f" --gpu -p 512 -n 64 -r 1
    bench_one "$n 8GiB copy" -m "$f" --gpu --gpu-budget 8GiB -p 512 -n 64 -r 1
    bench_one "$n 8GiB zerocopy" -m "$f" --gpu --gpu-budget 8GiB --gpu-miss zerocopy -p 512 -n 64 -r 1
    bench_one "$n 8GiB copy pp2048" -m "$f" --gpu --gpu-budget 8GiB -p 2048 -n 0 -r 1 -b 2048
  done
  grep -E "sluice: .*(copied|copying)" "$OUT/bench.log" | head -4 >> "$OUT/summary.txt"
fi

if has eager; then # resident decode without graphs: every op launched by the host, as in a streamed layer
  wait_for "$Q35" && bench_one "$(basename "$Q35" .gguf) resident decode, no graphs" -m "$Q35" --gpu --no-graph -p 16 -n 128 -r 1
fi

if has copy2; then # copy-mode decode twice on each 35B-A3B file (uniform, skew): the streamed decode's A/A
  for f in "$Q35" "$Q35Z"; do
    wait_for "$f" || { say "copy2: $(basename "$f") missing"; continue; }
    for r in 1 2; do
      SLUICE_MOE_TIMING=1 bench_one "$(basename "$f" .gguf) 8GiB copy ($r)" -m "$f" --gpu --gpu-budget 8GiB -p 512 -n 64 -r 1
      grep "moe timing" "$OUT/bench-tmp.txt" | tail -1 >> "$OUT/summary.txt"
    done
  done
fi

if has sab; then # A/B/A of environment variables on the streamed decode (same binary, same call)
  IFS=';' read -ra SAB_SETS <<< "${SAB_ENV:-}"
  sab_one() { # label, variables
    ( [ -n "$2" ] && export $2
      SLUICE_MOE_TIMING=1 bench_one "$1 8GiB ${SAB_MISS:-copy} [${2:-default}]" -m "$f" --gpu --gpu-budget 8GiB \
        --gpu-miss "${SAB_MISS:-copy}" -p 512 -n 64 -r 1
      grep "moe timing" "$OUT/bench-tmp.txt" | tail -1 >> "$OUT/summary.txt" )
  }
  for f in "$Q35Z" "$Q35"; do
    wait_for "$f" || { say "sab: $(basename "$f") missing"; continue; }
    n=$(basename "$f" .gguf)
    sab_one "$n" ""
    for v in "${SAB_SETS[@]}"; do sab_one "$n" "$v"; sab_one "$n" ""; done
  done
fi

if has hostbench; then # device_experts_run alone on this host: from its last-level cache and from DRAM
  for t in 1 8 16; do "$W/bench_kernels" --device-rows --threads $t --reps 3 --mb 2048; done >> "$OUT/summary.txt" 2>&1
fi

if has host; then
  # --gpu-miss host on the uniform 35B-A3B file: resident for the hashes, copy for the baseline,
  # then each HOST_CONFIGS entry ("N" or "N:L": --gpu-host-experts N, SLUICE_GPU_LOOK_MAX=L)
  if wait_for "$Q35"; then
    n=$(basename "$Q35" .gguf)
    bench_one "$n resident" -m "$Q35" --gpu -p 512 -n 64 -r 1
    for cb in ${COPY_BATCH_AB:-1 0 1}; do # the copies of a batch in one driver call, or one call each (A/B/A)
      SLUICE_CUDA_COPY_BATCH=$cb SLUICE_MOE_TIMING=1 bench_one "$n 8GiB copy (batch $cb)" -m "$Q35" --gpu \
        --gpu-budget 8GiB -p 512 -n 64 -r 1
      grep "moe timing" "$OUT/bench-tmp.txt" | tail -1 >> "$OUT/summary.txt"
    done
    for cfg in ${HOST_CONFIGS:-4 8 4:2 8:2}; do
      he=${cfg%%:*}; lm=0; [[ $cfg == *:* ]] && lm=${cfg##*:}
      j="$W/host-$he-$lm.json"
      t0=$(date +%s)
      SLUICE_MOE_TIMING=1 SLUICE_CUDA_HOST_TIMING=1 SLUICE_GPU_LOOK_MAX=$lm timeout ${BENCH_TIMEOUT:-150} "$SL" bench -m "$Q35" --gpu \
        --gpu-budget 8GiB --gpu-miss host --gpu-host-experts "$he" -p 512 -n 64 -r 1 --json > "$j" 2> "$W/host.err"
      say "sluice host $he look $lm ($(($(date +%s) - t0))s, rc=$?)"
      cat "$W/host.err" >> "$OUT/bench.log"
      grep -E "host experts:|moe timing" "$W/host.err" >> "$OUT/summary.txt"
      python3 - "$j" >> "$OUT/summary.txt" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    e = r["experts"]["decode"]
    print("  pp %.1f decode %.2f t/s, tpot p50 %.2f ms, logits %s, decode hits %d misses %d host %d, %.1f MB copied"
          % (r["prefill_tps"], r["decode_tps"], r["tpot_ms"]["p50"], r["evidence"]["logits_sha256"][:12],
             e["hits"], e["misses"], e["host_computed"], e["bytes_read"] / 1e6))
PY
    done
  else
    say "host: $(basename "$Q35") missing"
  fi
fi

if has stream30; then
  if wait_for "$Q30"; then
    n=$(basename "$Q30" .gguf)
    "$SL" bench -m "$Q30" --gpu --gpu-budget 8GiB --plan 2>&1 | grep -E "^gpu|vram|pinned" >> "$OUT/summary.txt"
    bench_one "$n resident" -m "$Q30" --gpu -p 512 -n 64 -r 1
    bench_one "$n 8GiB copy" -m "$Q30" --gpu --gpu-budget 8GiB -p 512 -n 64 -r 1
    bench_one "$n 8GiB zerocopy" -m "$Q30" --gpu --gpu-budget 8GiB --gpu-miss zerocopy -p 512 -n 64 -r 1
    bench_one "$n 8GiB copy pp2048" -m "$Q30" --gpu --gpu-budget 8GiB -p 2048 -n 0 -r 1 -b 2048
  else
    say "stream30: $(basename "$Q30") missing"
  fi
fi

if has pprof; then
  for f in "$Q30" "$Q35"; do
    wait_for "$f" || continue
    timeout 120 "$SL" bench -m "$f" --gpu --gpu-profile -p 2048 -n 0 -b 2048 -r 1 --no-warmup > "$W/pprof.log" 2>&1
    say "pprof $(basename "$f"): rc=$?"
    cat "$W/pprof.log" >> "$OUT/pprof.log"
    sed -n '/CUDA op profile/,/| total/p' "$W/pprof.log" >> "$OUT/summary.txt"
    timeout 120 "$SL" bench -m "$f" --gpu -p 2048 -n 0 -b 2048 -r 1 2>&1 | grep -E "^\| [qQ]" >> "$OUT/summary.txt"
    timeout 120 "$SL" bench -m "$f" --gpu -p 16 -n 128 -r 2 2>&1 | grep -E "^\| [qQ]" >> "$OUT/summary.txt"
    if [ -n "${PPROF_ENV:-}" ]; then # the same runs with diagnostic switches, e.g. SLUICE_CUDA_MM_COLS64=1;
      IFS=';' read -ra PPROF_VARIANTS <<< "$PPROF_ENV" # variants separated by ';', each "VAR=1 VAR2=0"
      for v in "${PPROF_VARIANTS[@]}"; do
        echo "with $v:" >> "$OUT/summary.txt"
        env $v timeout 120 "$SL" bench -m "$f" --gpu -p 2048 -n 0 -b 2048 -r 1 2>&1 | grep -E "^\| [qQ]" >> "$OUT/summary.txt"
        env $v timeout 120 "$SL" bench -m "$f" --gpu -p 16 -n 128 -r 2 2>&1 | grep -E "^\| [qQ]" >> "$OUT/summary.txt"
      done
      echo "without them, again:" >> "$OUT/summary.txt"
      timeout 120 "$SL" bench -m "$f" --gpu -p 16 -n 128 -r 2 2>&1 | grep -E "^\| [qQ]" >> "$OUT/summary.txt"
    fi
  done
fi

if has ktrace; then # needs sluice-ktrace in bin.tar.xz (KTRACE=1 bench/cuda/pack.sh)
  KT=$(dirname "$SL")/sluice-ktrace
  for f in "$Q35" "$Q30"; do
    wait_for "$f" || continue
    SLUICE_CUDA_KTRACE=1 timeout 120 "$KT" bench -m "$f" --gpu -p 16 -n 128 -r 1 > "$W/ktrace.log" 2>&1
    say "ktrace $(basename "$f"): rc=$?"
    cp "$W/ktrace.log" "$OUT/ktrace-$(basename "$f" .gguf).log"
    grep -E "^\| [qQ]|kernel trace" "$W/ktrace.log" >> "$OUT/summary.txt"
    if [ -n "${KTRACE_ENV:-}" ]; then # one more trace per ';'-separated set of variables
      IFS=';' read -ra KSETS <<< "$KTRACE_ENV"
      for ki in "${!KSETS[@]}"; do
        env ${KSETS[$ki]} SLUICE_CUDA_KTRACE=1 timeout 120 "$KT" bench -m "$f" --gpu -p 16 -n 128 -r 1 \
          > "$W/ktrace.log" 2>&1
        say "ktrace $(basename "$f") with ${KSETS[$ki]}: rc=$?"
        cp "$W/ktrace.log" "$OUT/ktrace-$(basename "$f" .gguf)-v$((ki + 1)).log"
        grep -E "^\| [qQ]|kernel trace" "$W/ktrace.log" | sed "s/^/[${KSETS[$ki]}] /" >> "$OUT/summary.txt"
      done
    fi
  done
fi

if has ncuk && command -v ncu >/dev/null && wait_for "$Q35"; then
  NS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
  # the output head: k_mv_q<Q6_K, 1 token, plain, full warp, one row a warp>, once a step
  ncu_head() {
    timeout 150 ncu --clock-control none --kernel-name-base mangled --kernel-name regex:_Z6k_mv_qILi14ELi1ELb0ELi32ELb0EE \
      --launch-count 1 $NS "$SL" bench -m "$Q35" --gpu --no-graph --no-warmup -p 1 -n 1 -r 1 >> "$OUT/ncuk.txt" 2>&1
  }
  : > "$OUT/ncuk.txt"
  ncu_head
  say "ncuk head: rc=$?"
  # the first layer's routed expert launches: gate/up with SwiGLU (DUAL) and the half-warp down rows
  ncu_experts() {
    timeout 150 ncu --clock-control none --kernel-name-base mangled \
      --kernel-name "regex:_Z(6k_mv_q|13k_mv_q_capped)ILi1[24]ELi1E(Lb1ELi32|Lb0ELi16)" --launch-count 3 $NS \
      "$SL" bench -m "$Q35" --gpu --no-graph --no-warmup -p 1 -n 1 -r 1 >> "$OUT/ncuk.txt" 2>&1
  }
  ncu_experts
  say "ncuk experts: rc=$?"
  if [ -n "${NCUK_ENV:-}" ]; then
    echo "== with $NCUK_ENV" >> "$OUT/ncuk.txt"
    ( export $NCUK_ENV; ncu_head; ncu_experts )
    say "ncuk head and experts with $NCUK_ENV: rc=$?"
  fi
  grep -aE "k_mv_q|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/ncuk.txt" >> "$OUT/summary.txt"
fi

if has quick35; then
  t0=$(date +%s)
  for i in $(seq 150); do [ -f "$Q35" ] && break; sleep 1; done
  say "quick35: synth $( [ -f "$Q35" ] && echo ready || echo MISSING) after $(($(date +%s) - t0))s"
  if [ -f "$Q35" ]; then
    SLUICE_CUDA_GRAPH_TIMING=1 timeout 100 "$SL" bench -m "$Q35" --gpu -p 512 -n 64 -r 1 > "$OUT/quick35.log" 2>&1
    say "quick35 sluice: rc=$?"; grep -E "^\| Q|graph replays" "$OUT/quick35.log" | tail -2 >> "$OUT/summary.txt"
    if [ -f .devcarry/llama.tar.xz ]; then
      mkdir -p "$W/llama" && tar xJf .devcarry/llama.tar.xz -C "$W/llama"
      LD_LIBRARY_PATH="$W/llama/bin:$LD_LIBRARY_PATH" timeout 100 "$W/llama/bin/llama-bench" -m "$Q35" \
        -ngl 99 -fa off -p 512 -n 64 -r 1 -o md >> "$OUT/quick35.log" 2>&1
      say "quick35 llama.cpp: rc=$?"; grep -E "^\| .*(pp512|tg64)" "$OUT/quick35.log" >> "$OUT/summary.txt"
    fi
  fi
fi

llama_one() { # label, args...
  local label=$1; shift
  local t0=$(date +%s)
  timeout 150 "$LB" "$@" -o md > "$OUT/llama-tmp.txt" 2>&1
  local rc=$?
  cat "$OUT/llama-tmp.txt" >> "$OUT/llama.log"
  say "llama.cpp $label ($(($(date +%s) - t0))s, rc=$rc): llama-bench $*"
  grep -E "^\|" "$OUT/llama-tmp.txt" | grep -v -- "---" | tail -3 >> "$OUT/summary.txt"
}

if has llama && [ -f .devcarry/llama.tar.xz ]; then
  mkdir -p "$W/llama" && tar xJf .devcarry/llama.tar.xz -C "$W/llama"
  LB=$W/llama/bin/llama-bench
  export LD_LIBRARY_PATH="$W/llama/bin:$LD_LIBRARY_PATH"
  ldd "$LB" | grep "not found" >> "$OUT/summary.txt"
  # the carried build leaves out the flash-attention kernels (transfer limit): -fa off
  wait_for "$Q35" && llama_one "35B resident" -m "$Q35" -ngl 99 -fa off -p 2048 -n 128 -r 1
  if [ -z "${LLAMA_RESIDENT_ONLY:-}" ]; then
    [ -f "$Q35" ] && llama_one "35B -ncmoe 26" -m "$Q35" -ngl 99 -fa off -ncmoe 26 -p 512,2048 -n 64 -r 1
    [ -f "$Q35Z" ] && llama_one "35B skew -ncmoe 26" -m "$Q35Z" -ngl 99 -fa off -ncmoe 26 -p 512,2048 -n 64 -r 1
  fi
  [ -z "${NO30:-}" ] && wait_for "$Q30" && llama_one "30B resident" -m "$Q30" -ngl 99 -fa off -p 2048 -n 128 -r 1
  # 30B-A3B: 48 layers of ~0.34 GiB of experts; 19 on the GPU plus the dense weights is ~8 GiB
  has stream30 && [ -f "$Q30" ] && llama_one "30B -ncmoe 29" -m "$Q30" -ngl 99 -fa off -ncmoe 29 -p 512,2048 -n 64 -r 1
fi

if has waitsynth; then # keep this call until the background synth is done (a later call uses the files)
  wait_for "$Q35"; wait_for "$Q30"; say "waitsynth: $(ls /tmp/models | grep -v synth- | tr '\n' ' ')"
fi
[ -n "$SYNTH_PID" ] && kill "$SYNTH_PID" 2>/dev/null
rm -f "$OUT/bench-tmp.txt" "$OUT/llama-tmp.txt"
say "done"
cat "$OUT/summary.txt"
