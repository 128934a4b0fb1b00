#!/bin/sh
# Seed protocol, streamed: page cache dropped, fresh process, 8 GiB v1 memory cgroup; HEAD binary.
D=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
M=MODELS/q4x8l-mtp-Q2_0.gguf
OUT=bench/results/2026-12-02-mtp-vocab/stream
for p in p1 p2 p3 p4; do
  for v in plain mtp2; do
    X=""; [ $v = mtp2 ] && X="--mtp 2"
    bash bench/results/2026-11-29-qwen4exp-8l-stream-8g/run_one.sh stream-$p-$v 8G $OUT \
      build/sluice bench -m $M --stream --json --no-warmup --prompt-file $D/$p.txt -p 48 -n 128 -r 1 -t 2 $X > /dev/null
  done
done
