"""Parity of the PyTorch Needle 2 with the fixture references and with the engine.

    /usr/bin/python3 tools/train/test_parity.py [--model tiny] [--engine] [--tol 1e-4]

Loads $NEEDLE_FIXTURES/v2/models/<model>.cact ($NEEDLE_FIXTURES defaults to ../shared/fixtures
beside the repository; dequantised, cq-kernels.md §10) into needle2.Needle2 and compares the
prompt-pass logits of every fixture prompt with the upstream reference
(refs/<model>/<prompt>.full.f32). With --engine, also compares with the engine's
last-position logits through bindings/python/needle.py on build/libneedle.so. The largest
absolute difference must be <= --tol (exit 1 otherwise). Takes ~10 s for tiny on 2 cores.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import cact  # noqa: E402
import needle2  # noqa: E402

# $NEEDLE_FIXTURES (as for the engine's tests), else ../shared/fixtures beside the repository.
FIXTURES = os.path.join(os.environ.get("NEEDLE_FIXTURES") or os.path.join(ROOT, "..", "shared", "fixtures"),
                        "v2")


def load_model(path):
    c = cact.Container.open(path)
    g = needle2.Geometry.from_header(c.header)
    m = needle2.Needle2(g)
    canon = g.canon()
    m.load_arrays([c.tensor(i) for i in range(len(canon))])
    return m, c


def engine_logits(path, ids):
    sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
    os.environ.setdefault("NEEDLE_LIB", os.path.join(ROOT, "build", "libneedle.so"))
    import needle
    with needle.Model(path) as model, model.new_state() as state:
        return np.array(state.prefill(ids), np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--engine", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    mpath = os.path.join(FIXTURES, "refs", args.model, "manifest.json")
    if not os.path.isfile(mpath):
        sys.exit("test_parity: no fixture references at %s; set NEEDLE_FIXTURES to the folder "
                 "that holds v2/ (the project's shared/fixtures)" % mpath)
    manifest = json.load(open(mpath))
    path = os.path.join(FIXTURES, manifest["cact"])
    t0 = time.time()
    model, _ = load_model(path)
    worst = 0.0
    for pr in manifest["prompts"]:
        ids = pr["ids"]
        ref = np.fromfile(os.path.join(FIXTURES, pr["full"]["file"]), "<f4")
        ref = ref.reshape(pr["full"]["shape"])
        with torch.no_grad():
            got = model(torch.tensor([ids], dtype=torch.int64))[0].numpy()
        d_ref = float(np.abs(got - ref).max())
        line = "%-12s S=%3d  torch-vs-ref %.2e" % (pr["name"], len(ids), d_ref)
        worst = max(worst, d_ref)
        if args.engine:
            eng = engine_logits(path, ids)
            d_eng = float(np.abs(got[-1] - eng).max())
            line += "  torch-vs-engine(last) %.2e" % d_eng
            worst = max(worst, d_eng)
        print(line)
    print("worst %.3e (tol %.1e), %.1f s" % (worst, args.tol, time.time() - t0))
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
