#!/usr/bin/env bash
# Alternating decode runs with the page cache already holding the model in 2 MiB pages (NEW read
# it so once first): the change must cost nothing there (it only reads /proc/self/smaps).
M=${M:-MODELS/q3.gguf}
OLD=${OLD:-build-5319293/sluice}
NEW=${NEW:-build/sluice}
"$NEW" bench -m "$M" -p 16 -n 8 -r 1 -t 2 2>&1 | grep -E "sluice: the page"
echo "FileHugePages $(awk '/FileHugePages/{print $2}' /proc/meminfo) kB"
for round in 1 2; do
  for b in old new; do
    if [ $b = old ]; then BIN=$OLD; else BIN=$NEW; fi
    echo "round $round $b"
    "$BIN" bench -m "$M" -p 16 -n 64 -r 2 -t 2 2>&1 | grep -E "Qwen3|sluice: the page"
  done
done
