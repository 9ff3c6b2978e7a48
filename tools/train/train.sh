#!/usr/bin/env bash
# Regenerates the demo model from nothing with fixed seeds: data, tokenizer, training, export
# (issue 10 item 7). About 35-45 minutes on an idle 2-core machine; not run in CI.
#
#   tools/train/train.sh            # everything into build/train/
#   STEPS=300 tools/train/train.sh  # a short smoke run
#
# Environment: OUT (output dir, default build/train), STEPS (default 2500), SEED (default 1),
# THREADS (torch threads, default 1: the machine is usually shared), PYTHON (Debian's python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-build/train}
STEPS=${STEPS:-2500}
SEED=${SEED:-1}
THREADS=${THREADS:-1}
export OPENBLAS_NUM_THREADS=$THREADS PYTHON=$PY

tools/train/setup.sh
[ -f build/CMakeCache.txt ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2 --target needle needle-make-model
mkdir -p "$OUT"

echo "== 1/5 the PyTorch model against the fixtures and the engine"
"$PY" tools/train/test_parity.py --engine
echo "== 2/5 data"
"$PY" tools/train/data.py --out "$OUT" --seed "$SEED"
echo "== 3/5 tokenizer"
"$PY" tools/train/tokenizer.py --corpus "$OUT/corpus.txt" --vocab 1024 --out "$OUT/tok"
echo "== 4/5 training ($STEPS steps)"
nice -n 19 "$PY" tools/train/train.py --data "$OUT" --out "$OUT/ckpt.pt" --steps "$STEPS" \
  --seed "$SEED" --threads "$THREADS" | tee "$OUT/train.log"
echo "== 5/5 export"
nice -n 19 "$PY" tools/train/export.py --data "$OUT" --ckpt "$OUT/ckpt.pt" \
  --out "$OUT/needle-demo.cact" --engine | tee "$OUT/export.log"
