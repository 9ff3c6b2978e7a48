#!/usr/bin/env bash
# Regenerates the demo model from nothing with fixed seeds: data, tokenizer, training, export
# (issue 10 item 7); not run in CI. Training is CPU-bound at ~0.57 CPU-seconds per batch-32
# step on one Zen 4 core (1.5 on the older Xeon): the two stages below are ~45 minutes of one
# idle core, the whole script ~50.
#
#   tools/train/train.sh            # everything into build/train/
#   STEPS1=300 STOP1=300 STEPS2=300 tools/train/train.sh   # a short smoke run
#   SHIP=1 tools/train/train.sh     # also write models/needle-demo.{cact,ref.json,heldout.json}
#
# Two stages (models/README.md): stage 1 learns the tools and phrasings on the first data set
# (a cosine over STEPS1 steps, stopped at STOP1); stage 2 continues from there on a copy-heavy
# set (data.py --copy: most names, cities and bodies made up, some random letter strings),
# with a fresh optimizer and a cosine over STEPS2, because stage 1 alone memorised the
# training names instead of learning to copy (0 held-out weather and message calls).
# The best stage-2 evaluation (held-out teacher-forced exact calls) is exported.
#
# Environment: OUT (output dir, default build/train), STEPS1/STOP1/STEPS2, SEED (default 1),
# THREADS (torch threads, default 1: on a shared, oversubscribed machine two OpenMP threads ran
# >4x slower than one; 30 s/step at batch 64 on the 2-core EPYC), MINUTES2 (optional
# wall-clock budget of stage 2, 0 = steps only), PYTHON (Debian's python3). Training runs at
# the caller's priority; the other steps at nice 10.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-build/train}
STEPS1=${STEPS1:-2400}
STOP1=${STOP1:-1500}
STEPS2=${STEPS2:-3200}
MINUTES2=${MINUTES2:-0}
SEED=${SEED:-1}
THREADS=${THREADS:-1}
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS PYTHON=$PY

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
echo "== 4/5 training: stage 1 ($STOP1 of a $STEPS1-step cosine), stage 2 ($STEPS2 steps)"
"$PY" tools/train/train.py --data "$OUT" --out "$OUT/ckpt1.pt" --steps "$STEPS1" --stop "$STOP1" \
  --batch 32 --lr 3e-3 --warmup 50 --eval-every 100 --eval-n 200 \
  --seed "$SEED" --threads "$THREADS" | tee "$OUT/train1.log"
nice -n 10 "$PY" tools/train/data.py --out "$OUT/stage2" --seed "$SEED" --copy
"$PY" tools/train/train.py --data "$OUT" --train-file "$OUT/stage2/train.jsonl" \
  --init "$OUT/ckpt1.pt.step$STOP1" --out "$OUT/ckpt.pt" --steps "$STEPS2" --minutes "$MINUTES2" \
  --batch 32 --lr 2e-3 --warmup 50 --eval-every 100 --eval-n 200 \
  --seed "$((SEED + 1))" --threads "$THREADS" | tee "$OUT/train2.log"
echo "== 5/5 export"
nice -n 10 "$PY" tools/train/export.py --data "$OUT" --ckpt "$OUT/ckpt.pt" \
  --out "$OUT/needle-demo.cact" --fixed-bits 4 --eval-n 300 --engine \
  --ref "$OUT/needle-demo.ref.json" --heldout "$OUT/needle-demo.heldout.json" --heldout-n 1000 \
  | tee "$OUT/export.log"
cmake --build build -j2 --target needle
nice -n 10 "$PY" tools/train/chat_eval.py --model "$OUT/needle-demo.cact" --data "$OUT" --n 1000 \
  | tee "$OUT/chat_eval.log"
if [ "${SHIP:-0}" = 1 ]; then
  cp "$OUT/needle-demo.cact" "$OUT/needle-demo.ref.json" "$OUT/needle-demo.heldout.json" models/
fi
