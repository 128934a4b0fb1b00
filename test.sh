#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, run every test:
#   1. the release build and its test suite (ctest)
#   2. without a GPU but with nvcc (CI): the CUDA backend compiled, and its tests that need no GPU
#   3. the same tests as 1 under AddressSanitizer + UndefinedBehaviorSanitizer
#   4. a short libFuzzer run of each parser
# FUZZ_SECONDS (default 30) sets the fuzzing time per target: 7 targets, 3.5 minutes in all.
# SLUICE_TEST_CLEAN=1 (CI sets it; automatic with less than 4 GiB free) removes each stage's
# build directory once its tests pass: a CI machine has run out of disk. A stage now takes at
# most ~250 MB built and its tests write up to ~180 MB more (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
jobs=$(nproc)
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
echo "== $free_mb MiB free on the build's file system"
clean=${SLUICE_TEST_CLEAN:-0}
if [ "$free_mb" -lt 4096 ]; then clean=1; fi
if [ "$free_mb" -lt 600 ]; then
  echo "warning: less than 600 MiB free here; one stage needs about 450 MB at its peak" >&2
fi
stage_done() { # the stage's build directory, once its tests passed
  if [ "$clean" = 1 ]; then rm -rf "$1"; fi
}

# With a GPU here, the release build includes the CUDA backend and ctest runs its tests. Without
# one, the release build leaves it out (each of its ~15 test programs would carry ~17 MB of GPU
# code that nothing here can run: 245 MB of a 420 MB build) and stage 2 compiles it on its own.
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
have_nvcc=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || [ -n "${CUDACXX:-}" ]; then have_nvcc=1; fi

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA="$([ "$have_gpu" = 1 ] && echo AUTO || echo OFF)" >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
stage_done build

if [ "$have_gpu" = 0 ] && [ "$have_nvcc" = 1 ]; then
  echo "== CUDA backend compiled with nvcc (no GPU here: its tests that need none)"
  # machine code for sm_80 and sm_90 only, no PTX: this build is a compile check (its GPU-less
  # tests run host code); 122 MB instead of 139
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=80-real;90-real" >/dev/null
  cmake --build build-cuda -j"$jobs" --target sluice test_cuda test_cuda_codecs test_ep
  (cd build-cuda && ctest --output-on-failure -R '^cuda')
  stage_done build-cuda
fi

echo "== AddressSanitizer + UBSan build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$jobs")
stage_done build-asan

echo "== fuzzing"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSLUICE_FUZZ=ON -DSLUICE_TESTS=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_targets
tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-30}"
stage_done build-fuzz
echo "== all tests passed"
