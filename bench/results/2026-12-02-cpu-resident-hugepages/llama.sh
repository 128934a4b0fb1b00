#!/usr/bin/env bash
# llama.cpp's decode with the page cache in 4 KiB pages, then after sluice's load has read the
# file again in 2 MiB pages (llama.cpp repacks its weights into its own memory, so it should
# not care). SMALL = smallpages built from smallpages.c.
M=${M:-MODELS/q3.gguf}
L=${LLAMA_BENCH:-llama-bench}
S=${SLUICE:-build/sluice}
SMALL=${SMALL:-./smallpages}
for round in 1 2; do
  "$SMALL" "$M" > /dev/null
  echo "round $round llama.cpp, page cache in 4 KiB folios: FileHugePages $(awk '/FileHugePages/{print $2}' /proc/meminfo) kB"
  "$L" -m "$M" -p 0 -n 64 -r 2 -t 2 -o md 2>/dev/null | grep -E "tg64"
  "$S" bench -m "$M" -p 16 -n 8 -r 1 -t 2 2>&1 | grep -E "sluice: the page"
  echo "round $round llama.cpp, after sluice's load: FileHugePages $(awk '/FileHugePages/{print $2}' /proc/meminfo) kB"
  "$L" -m "$M" -p 0 -n 64 -r 2 -t 2 -o md 2>/dev/null | grep -E "tg64"
done
