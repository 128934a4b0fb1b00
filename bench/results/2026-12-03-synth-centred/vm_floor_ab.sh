#!/usr/bin/env bash
# (bench/results/2026-12-03-synth-centred) one VM floor run and the replay of its decode reads right after:
#   BIN=path/to/ngram_stall vm_floor_ab.sh LABEL [VAR=VALUE ...]   (M= another model file)
# floor run + replay of its decode reads right after; args: label envs...
set -u
cd /work/main
P=bench/results/2026-11-29-qwen4exp-8l-stream-8g/prompts/long4k.txt; M=${M:-/work/bench-data/q4x8l-Q2_0-m.gguf}
BIN=${BIN:?ngram_stall binary}
label=$1; shift
sync; echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "cpu user %U sys %S" -o /tmp/ab/$label.time env "$@" SLUICE_IO_LOG=/tmp/ab/$label.iolog $BIN $M $P 48 64 512 2 stream forced 81 > /tmp/ab/$label.out 2>&1
pe=$(awk '/^prefill experts/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1)}}' /tmp/ab/$label.out)
pn=$(awk '/^ngram prefill/{for(i=1;i<=NF;i++) if($i=="bytes"){print $(i+1); exit}}' /tmp/ab/$label.out)
dec=$(grep -o "decode 64 tokens [0-9.]* s" /tmp/ab/$label.out | awk '{print $4}')
rep=$(bash bench/stream/io_ceiling.sh /tmp/ab/$label.iolog --skip-bytes $((pe+pn)) --depth 128 | awk "/depth/{print \$6}")
ex=$(grep "^decode experts" /tmp/ab/$label.out | grep -o "bytes [0-9]*\|io_wait_s [0-9.]*\|prefetch [0-9/]*" | tr '\n' ' ')
tm=$(cat /tmp/ab/$label.time)
echo "$label $tm decode $dec s replay $rep s ratio $(awk -v a=$rep -v b=$dec 'BEGIN{printf "%.0f%%", 100*a/b}') $ex"
rm -f /tmp/ab/$label.iolog
