#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, run the embedded
# default model. Extra arguments go to `sluice run` (e.g. ./run.sh -m model.gguf -p "Hello").
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target sluice
./build/sluice run "$@"
