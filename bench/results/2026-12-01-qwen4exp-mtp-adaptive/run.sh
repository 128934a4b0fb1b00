#!/usr/bin/env bash
# issue 10: MTP adaptive vs plain vs always, streamed (8 GiB cgroup, cold) and resident
set -u
M=MODELS/q4x8l-mtp-Q2_0.gguf S=build/sluice PR=prompts
for p in 1 2; do
  for v in plain mtp1 mtp1always; do
    case $v in plain) A="";; mtp1) A="--mtp 1";; mtp1always) A="--mtp 1 --mtp-always";; esac
    ./run_one.sh stream-p$p-$v 8G . $S bench -m $M --stream --json -o stream-p$p-$v.json --no-warmup --prompt-file $PR/p$p.txt -p 48 -n 128 -r 1 -t 2 $A > /dev/null
  done
done
cat $M > /dev/null
for p in 1 2; do
  for v in plain mtp1 mtp1always; do
    case $v in plain) A="";; mtp1) A="--mtp 1";; mtp1always) A="--mtp 1 --mtp-always";; esac
    ./run_one.sh res-p$p-$v none . $S bench -m $M --resident --json -o res-p$p-$v.json --no-warmup --prompt-file $PR/p$p.txt -p 48 -n 128 -r 1 -t 2 $A > /dev/null
  done
done
echo done > run.done
