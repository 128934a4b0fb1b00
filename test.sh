#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, run every test:
#   1. the release build and its test suite (ctest)
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. a short libFuzzer run of each parser
# FUZZ_SECONDS (default 30) sets the fuzzing time per target: 7 targets, 3.5 minutes in all.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
jobs=$(nproc)

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== AddressSanitizer + UBSan build and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$jobs")

echo "== fuzzing"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSLUICE_FUZZ=ON -DSLUICE_TESTS=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_targets
tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-30}"
echo "== all tests passed"
