#!/usr/bin/env bash
# One call on the GPU machine (tools `run`), from the repository root, with tools/train/data's
# tokenizer/ and *.u16 carried: the converter's reference fixtures (tools/hf_reference.py, on the
# CPU, in the background) and the training run (tools/train/train.py, on the GPU) side by side.
# Everything comes back through $OUT as at most 6 files of at most 16 MB:
#   env.txt, fixtures.tar (tests/data/hf material), model-0000{1,2}-of-00002.safetensors,
#   trained.tar (report.json, train.log, config/index json), logs.txt
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" /tmp/ref /tmp/train
python3 -c "import sys, torch, transformers, tokenizers, safetensors; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
(OMP_NUM_THREADS=8 timeout 400 python3 tools/hf_reference.py /tmp/ref >/tmp/ref.log 2>&1; echo "hf_reference rc=$?" >>/tmp/ref.log) &
timeout 420 python3 tools/train/train.py tools/train/data /tmp/train --seconds "${TRAIN_SECONDS:-200}" ${TRAIN_ARGS:-} >/tmp/train.out 2>&1
echo "train rc=$?" >>/tmp/train.out
wait
tar cf "$OUT/fixtures.tar" -C /tmp/ref . 2>/dev/null
cp /tmp/train/hf/*.safetensors "$OUT/" 2>/dev/null
(cd /tmp/train && tar cf "$OUT/trained.tar" report.json train.log hf/config.json hf/generation_config.json hf/model.safetensors.index.json 2>/dev/null)
{ echo "== hf_reference"; cat /tmp/ref.log; echo "== train"; cat /tmp/train.out; } >"$OUT/logs.txt"
tail -c 6000 /tmp/ref.log; grep -v "^step" /tmp/train.out | tail -c 5000; grep "^step" /tmp/train.out | tail -5
ls -la "$OUT"
