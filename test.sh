#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, run every test:
#   1. the release build and its test suite (ctest)
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. a short libFuzzer run of each parser
# FUZZ_SECONDS (default 30) sets the fuzzing time per target: 7 targets, 3.5 minutes in all.
# SLUICE_TEST_CLEAN=1 (CI sets it; automatic with less than 4 GiB free) removes each stage's
# build directory once its tests pass: a stage takes ~450 MB built (~650 MB with the CUDA code)
# and its tests write up to ~250 MB more while they run, and a CI machine has run out of disk.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
jobs=$(nproc)
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
echo "== $free_mb MiB free on the build's file system"
clean=${SLUICE_TEST_CLEAN:-0}
if [ "$free_mb" -lt 4096 ]; then clean=1; fi
if [ "$free_mb" -lt 1024 ]; then
  echo "warning: less than 1 GiB free here; one stage needs about 1 GiB at its peak" >&2
fi
stage_done() { # the stage's build directory, once its tests passed
  if [ "$clean" = 1 ]; then rm -rf "$1"; fi
}

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
stage_done build

echo "== AddressSanitizer + UBSan build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
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
