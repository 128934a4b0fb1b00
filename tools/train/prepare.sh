#!/usr/bin/env bash
# Build the training inputs in tools/train/data (ignored by git; the device run carries it):
#   train/valid/heldout.txt  the KJV corpus (make_corpus.sh, from Debian's packages)
#   tokenizer/               byte-level BPE, 4096 tokens, trained on train.txt (bpe.py)
#   {train,valid,heldout}.u16  the three texts encoded with it (uint16 token ids)
# Also the 1024-token tokenizer of the converter test fixtures (tests/data/hf/tokenizer).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
d="$here/data"
[ -f "$d/train.txt" ] || bash "$here/make_corpus.sh"
$py "$here/bpe.py" train "$d/train.txt" 4096 "$d/tokenizer"
for s in train valid heldout; do
  $py "$here/bpe.py" encode "$d/tokenizer/tokenizer.json" "$d/$s.txt" "$d/$s.u16"
done
$py "$here/bpe.py" train "$d/train.txt" 1024 "$repo/tests/data/hf/tokenizer"
