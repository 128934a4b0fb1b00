#!/usr/bin/env bash
# issue 10 seed protocol, prefill part: a 4K-token prompt in 1K chunks, streamed in an 8 GiB
# cgroup (cold cache) and resident (no limit, file pre-read), fresh process each
set -u
cd WORK/q4k4
M=WORK/q4x8l-Q2_0.gguf S=build/sluice
P=CHECKOUT/bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/long4k.txt
./run_one.sh stream-4k 8G . timeout 1200 $S bench -m $M --stream --json -o stream-4k.json --no-warmup --prompt-file $P -p 4096 -b 1024 -n 4 -r 1 -t 2
cat $M > /dev/null
./run_one.sh res-4k none . timeout 1200 $S bench -m $M --resident --json -o res-4k.json --no-warmup --prompt-file $P -p 4096 -b 1024 -n 4 -r 1 -t 2
echo done > run4k.done
