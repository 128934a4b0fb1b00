#!/usr/bin/env bash
# Rebuild tools/train/data/{train,heldout}.txt from Debian's public-domain KJV Bible packages.
# The packages are unpacked in a scratch directory (never installed, never inside the repo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && apt-get download bible-kjv bible-kjv-text >/dev/null)
for deb in "$scratch"/*.deb; do dpkg -x "$deb" "$scratch/x"; done
"$scratch/x/usr/bin/bible" -p "$scratch/x/usr/lib" -l 100000 "Gen1:1-Rev22:21" >"$scratch/kjv.txt"
mkdir -p "$here/data"
/usr/bin/python3 "$here/make_corpus.py" "$scratch/kjv.txt" "$here/data"
