#!/usr/bin/env bash
# Alternating decode runs, the page cache refilled with the model in 4 KiB pages before each:
# OLD = sluice at 5319293 (maps whatever the page cache holds), NEW = this change (reads the
# file again in 2 MiB pages). SMALL = smallpages built from smallpages.c.
M=${M:-MODELS/q3.gguf}
OLD=${OLD:-build-5319293/sluice}
NEW=${NEW:-build/sluice}
SMALL=${SMALL:-./smallpages}
for round in 1 2 3; do
  for b in old new; do
    "$SMALL" "$M" > /dev/null
    if [ $b = old ]; then BIN=$OLD; else BIN=$NEW; fi
    s=$(date +%s.%N)
    out=$("$BIN" bench -m "$M" -p 16 -n 64 -r 2 -t 2 2>&1)
    e=$(date +%s.%N)
    echo "round $round $b wall $(echo "$e - $s" | bc) s"
    echo "$out" | grep -E "Qwen3|sluice: the page"
  done
done
