#!/usr/bin/env bash
# Streamed decode (--stream, the expert cache the plan chooses) with the page cache refilled with
# the model in 4 KiB pages before each run: OLD = sluice at 5319293, NEW = this change (reads the
# dense runs again in 2 MiB pages). SMALL = smallpages built from smallpages.c.
M=${M:-MODELS/q3.gguf}
OLD=${OLD:-build-5319293/sluice}
NEW=${NEW:-build/sluice}
SMALL=${SMALL:-./smallpages}
for round in 1 2; do
  for b in old new; do
    "$SMALL" "$M" > /dev/null
    if [ $b = old ]; then BIN=$OLD; else BIN=$NEW; fi
    echo "round $round $b"
    "$BIN" bench -m "$M" --stream -p 16 -n 32 -r 1 -t 2 2>&1 | grep -E "Qwen3|sluice: the page"
  done
done
