#!/bin/bash
# one f81 decode run (8 GiB cgroup, cold) and the replay of its reads right after
set -eu
NAME=$1; M=${M:-MODELS/q4x8l-Q2_0.gguf}; BIN=${BIN:-WORK/ngram_stall}
C=CHECKOUT
R=$C/bench/results/2026-11-29-qwen4exp-8l-stream-8g
D=${D:-WORK/o}; mkdir -p $D
cd $D
SLUICE_IO_LOG=$D/$NAME.iolog $R/run_one.sh $NAME 8G $D $BIN $M $R/prompts/long4k.txt 48 64 512 2 stream forced 81 >/dev/null
pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' $NAME.out)
pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' $NAME.out)
dec=$(awk '/^prefill/{for(i=1;i<=NF;i++) if($i=="decode"){print $(i+3)}}' $NAME.out)
echo "$NAME: $(grep -E '^prefill [0-9]' $NAME.out)"
grep -E "^decode experts" $NAME.out
[ -n "${NOREPLAY:-}" ] && exit 0
$C/bench/stream/io_ceiling.sh $NAME.iolog --skip-bytes $((pe+pn)) --depth "${DEPTHS:-32 128}" | tee $NAME.replay
awk -v d=$dec '/^depth/{printf "  ratio at %s: %.0f%%\n", $0, 100*$6/d}' $NAME.replay
