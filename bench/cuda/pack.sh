#!/usr/bin/env bash
# Prepare what one call on the GPU machine needs (tools `run`), in .devcarry/ (ignored through
# .git/info/exclude, named in the call's `carry`): the device has no registry access and lacks
# sluice's build dependencies, so sluice is built here for sm_90 and carried with the few
# shared libraries the device may miss.
#
#   bench/cuda/pack.sh [FIXTURE...]       fixture names from ../shared/fixtures/models to carry
#   LLAMA=DIR bench/cuda/pack.sh ...      also carry a llama.cpp CUDA build (DIR/bin)
#   KTRACE=1 bench/cuda/pack.sh ...       also carry sluice-ktrace (-DSLUICE_CUDA_KTRACE=ON)
#
# Output: .devcarry/bin.tar.xz (sluice, test_cuda, test_ep, bench_kernels, libs), .devcarry/fixtures/ (models and their
# golden prompt ids), .devcarry/llama.tar.xz. The binaries embed stories260K as the default
# model (the checkout's default model is far larger than what a call may carry).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
EXCLUDE=$(git rev-parse --git-path info/exclude) # also right in a linked worktree
grep -qx '/.devcarry/' "$EXCLUDE" 2>/dev/null || echo '/.devcarry/' >> "$EXCLUDE"
B=build-cuda-dev
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real >/dev/null
sed -i "s|\.incbin \".*\"|.incbin \"$ROOT/models/stories260K.gguf\"|" $B/default_model.S
cmake --build $B -j2 --target sluice test_cuda test_ep bench_kernels >/dev/null
rm -rf .devcarry/stage .devcarry/fixtures && mkdir -p .devcarry/stage/lib .devcarry/fixtures
cp $B/sluice $B/tests/test_cuda $B/tests/test_ep $B/bench_kernels .devcarry/stage/
strip .devcarry/stage/sluice .devcarry/stage/test_cuda .devcarry/stage/test_ep .devcarry/stage/bench_kernels
if [ -n "${KTRACE:-}" ]; then # a kernel-trace build as well (measurement only; run_h200.sh ktrace)
  K=build-cuda-ktrace
  cmake -S . -B $K -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DSLUICE_CUDA_KTRACE=ON -DSLUICE_TESTS=OFF >/dev/null
  sed -i "s|\.incbin \".*\"|.incbin \"$ROOT/models/stories260K.gguf\"|" $K/default_model.S
  cmake --build $K -j2 --target sluice >/dev/null
  cp $K/sluice .devcarry/stage/sluice-ktrace
  strip .devcarry/stage/sluice-ktrace
fi
for l in libmicrohttpd.so.12 libjansson.so.4 liburing.so.2 libpcre2-8.so.0; do
  cp -L /lib/x86_64-linux-gnu/$l .devcarry/stage/lib/
done
tar cf - -C .devcarry/stage . | xz -T2 -9 > .devcarry/bin.tar.xz
rm -rf .devcarry/stage
for f in "$@"; do
  cp "$ROOT/../shared/fixtures/models/$f.gguf" .devcarry/fixtures/
  cp "$ROOT/../shared/fixtures/golden/$f.prompt.ids" .devcarry/fixtures/ 2>/dev/null || true
done
if [ -n "${LLAMA:-}" ]; then
  tar cf - -C "$LLAMA" bin | xz -T2 -6 > .devcarry/llama.tar.xz
fi
du -sh .devcarry/*
(git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- | tail -1 |
  awk '{printf "working tree that travels: %.1f MB\n", $1/1e6}'
du -cb .devcarry | tail -1 | awk '{printf "carried: %.1f MB (limit for both: 67.1 MB)\n", $1/1e6}'
