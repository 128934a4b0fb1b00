#!/usr/bin/env bash
# Run each fuzz target for a few seconds from its seed corpus: ./run.sh BUILD_DIR SECONDS
set -euo pipefail
build=$(cd "$1" && pwd) # absolute: each target runs from its corpus directory
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
for t in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  corpus=$(mktemp -d)
  seeds="$here/corpus_${name#fuzz_}"
  [ -d "$seeds" ] && cp "$seeds"/* "$corpus"/
  echo "fuzzing $name for ${secs}s"
  # a crash or leak fails the run (set -o pipefail): tail keeps the log short, not the status
  (cd "$corpus" && set -o pipefail && "$t" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 . 2>&1 | tail -20)
  rm -rf "$corpus"
done
