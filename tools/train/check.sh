#!/usr/bin/env bash
# Quick check of the training side (about 30 s on the idle 2-core VM; needs tools/train/setup.sh and
# a build with libneedle and needle-make-model; fixtures from $NEEDLE_FIXTURES, else ../shared/fixtures):
#  1. the PyTorch Needle 2 reproduces the v2 fixtures' logits and the engine's (<= 1e-4) on
#     tiny, odd (kv_window 0, d_model 96) and ternary;
#  2. a short pipeline run (small data set, tokenizer, 5 training steps, export at 4 bits
#     through the writer) loads in the engine, whose tokenizer agrees with the trainer's
#     (tokenizer.py) and whose logits equal the dequantised PyTorch model's (<= 1e-4);
#  3. the same 5 steps with --workers 2 give the same weights (<= 1e-3 at lr 3e-3).
# Exit status non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$PY" tools/train/test_fused.py | tail -1
for m in tiny odd ternary; do
  "$PY" tools/train/test_parity.py --model "$m" --engine | tail -1
done
"$PY" tools/train/data.py --out "$tmp" --train 3000 --test 40 --seed 7
"$PY" tools/train/tokenizer.py --corpus "$tmp/corpus.txt" --vocab 1024 --out "$tmp/tok" >/dev/null
"$PY" tools/train/train.py --data "$tmp" --out "$tmp/ckpt.pt" --steps 5 --batch 8 \
  --eval-every 5 --eval-n 16 | tail -1
"$PY" tools/train/export.py --data "$tmp" --ckpt "$tmp/ckpt.pt" --out "$tmp/m.cact" \
  --fixed-bits 4 --eval-n 16 --engine | tail -1
# 3. two data-parallel workers take the same steps as one process (summation order aside)
"$PY" tools/train/train.py --data "$tmp" --out "$tmp/w2.pt" --steps 5 --batch 8 \
  --eval-every 5 --eval-n 16 --workers 2 | tail -1
"$PY" - "$tmp/ckpt.pt" "$tmp/w2.pt" <<'EOF'
import sys, numpy as np, torch
a, b = (torch.load(f)["arrays"] for f in sys.argv[1:])
d = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
print("--workers 2 vs 1: weights within %.1e" % d)
sys.exit(d > 1e-3)  # Adam moves a near-zero gradient's weight by ~lr whatever its rounding
EOF
echo "train/check: ok"
