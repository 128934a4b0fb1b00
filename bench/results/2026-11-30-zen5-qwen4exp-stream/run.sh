#!/usr/bin/env bash
# issue 10 on the Zen 5 host: the seed's protocol with the Q2_0 tile (sluice at HEAD)
set -u
cd WORK
M=MODELS/q4x8l-Q2_0.gguf S=build/sluice
PR=CHECKOUT/bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts
fio_one() { echo 3 > /proc/sys/vm/drop_caches; fio --name=experts --filename=$M --readonly --direct=1 --ioengine=io_uring --rw=randread --bs=452K --iodepth=32 --runtime=10 --time_based --group_reporting 2>&1 | grep READ: ; }
echo "fio before: $(fio_one)" > fio.txt
for p in 1 2 3 4; do
  ./run_one.sh stream-p$p 8G . $S bench -m $M --stream --json -o stream-p$p.json --no-warmup --prompt-file $PR/p$p.txt -p 48 -n 64 -r 1 -t 2 > /dev/null
done
./run_one.sh forced81 8G . ngram_stall $M $PR/long4k.txt 48 64 512 2 stream forced 81 > /dev/null
echo "fio middle: $(fio_one)" >> fio.txt
./run_one.sh stream-4k 8G . timeout 1200 $S bench -m $M --stream --json -o stream-4k.json --no-warmup --prompt-file $PR/long4k.txt -p 4096 -b 1024 -n 4 -r 1 -t 2 > /dev/null
cat $M > /dev/null
./run_one.sh res-4k none . timeout 1200 $S bench -m $M --resident --json -o res-4k.json --no-warmup --prompt-file $PR/long4k.txt -p 4096 -b 1024 -n 4 -r 1 -t 2 > /dev/null
for p in 1 2 3 4; do
  ./run_one.sh res-p$p none . $S bench -m $M --resident --json -o res-p$p.json --no-warmup --prompt-file $PR/p$p.txt -p 48 -n 64 -r 1 -t 2 > /dev/null
done
echo "fio after: $(fio_one)" >> fio.txt
echo done > run.done
