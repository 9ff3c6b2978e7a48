#!/usr/bin/env bash
# Installs the trainer's Python dependencies from Debian (only what is missing): PyTorch, numpy,
# sentencepiece, tzdata (its zone names are the city word list of the data generator), wamerican
# (/usr/share/dict/words: message bodies, labels and made-up names) and
# OpenBLAS: Debian's torch calls the system libblas.so.3, and the reference BLAS it otherwise
# gets is ~10x slower.
# Uses Debian's /usr/bin/python3 (override with $PYTHON), not a pyenv or venv one.
# Not called by scripts/setup.sh: the engine does not need any of this. Safe to run again.
set -euo pipefail

packages=(python3 python3-torch python3-numpy python3-sentencepiece tzdata wamerican
          libopenblas0-pthread)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "train/setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
"${PYTHON:-/usr/bin/python3}" -c "import torch, numpy, sentencepiece" || { echo "train/setup: import failed" >&2; exit 1; }
echo "train/setup: ok"
