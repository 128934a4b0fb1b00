#!/usr/bin/env bash
# The I/O ceiling of a streamed run: replay exactly the reads it made, as fast as the disk gives
# them, with fio (Debian's fio), and print how long they take.
#
#   SLUICE_IO_LOG=reads.iolog sluice ...        (or any program on libsluice) writes the log
#   bench/stream/io_ceiling.sh reads.iolog [--skip-bytes B] [--depth "32 64"]
#
# The log is fio's iolog v2 (runtime/io.c): one line per read the engines submitted, in order.
# --skip-bytes drops the first B bytes of reads (the prompt's, say, so that only a decode's reads
# are replayed; B from the run's own expert and n-gram byte counts). Each depth replays the
# reads with --direct=1 on io_uring, no waits between them (--replay_no_stall=1), after dropping
# the page cache; the run's share of the ceiling is then (replay seconds) / (run's I/O-phase
# seconds). Paths in the log must not contain spaces (fio's iolog splits on whitespace).
set -euo pipefail
usage() { sed -n '2,14p' "$0"; exit 2; }
[ $# -ge 1 ] || usage
LOG=$1; shift
SKIP=0; DEPTHS="32 64"
while [ $# -gt 0 ]; do
  case $1 in
    --skip-bytes) SKIP=$2; shift 2 ;; --depth) DEPTHS=$2; shift 2 ;; *) usage ;;
  esac
done
[ -f "$LOG" ] || { echo "io_ceiling: $LOG: no such file" >&2; exit 1; }
command -v fio >/dev/null || { echo "io_ceiling: fio is not installed (apt-get install fio)" >&2; exit 1; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# the header; each file's first add and open (engines of one process may open one file twice,
# which fio refuses); no close lines (fio closes at the end); reads once SKIP bytes are dropped
awk -v skip="$SKIP" 'NR == 1 { print; next }
  $2 == "add" || $2 == "open" { if (!seen[$1 " " $2]++) print; next }
  $2 == "close" { next }
  $2 == "read" { if (dropped < skip) { dropped += $4; next } n++; b += $4; print }
  END { printf "%d %.1f\n", n, b / 1e6 > "/dev/stderr" }' "$LOG" > "$TMP/replay.iolog" 2> "$TMP/count"
read -r N MB < "$TMP/count"
[ "$N" -gt 0 ] || { echo "io_ceiling: no reads to replay" >&2; exit 1; }
echo "replaying $N reads, $MB MB"
for d in $DEPTHS; do
  sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches
  fio --name=replay --read_iolog="$TMP/replay.iolog" --replay_no_stall=1 --direct=1 \
    --ioengine=io_uring --iodepth="$d" --output-format=json > "$TMP/fio.json" 2> "$TMP/fio.err" ||
    { cat "$TMP/fio.err" >&2; exit 1; }
  python3 - "$TMP/fio.json" "$d" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
secs = j["runtime"] / 1000.0
print(f"depth {sys.argv[2]}: {j['io_bytes'] / 1e6:.1f} MB in {secs:.3f} s, {j['io_bytes'] / 1e9 / secs if secs else 0:.2f} GB/s")
EOF
done
