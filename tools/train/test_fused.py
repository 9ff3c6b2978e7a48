"""The fused kernels (fused.c through fused.py) against PyTorch in float64, forward and backward.

    /usr/bin/python3 tools/train/test_fused.py

Sinkhorn (model-v2.md §2.2, 20 iterations) on random [N, n, n] for n = 3, 4 and 8 and several
scales, N not a multiple of the C block (64 tokens), and the lane mix P @ X, including an expanded
X as the first layer passes it. Tolerance: float rounding, 1e-5 of each tensor's largest
magnitude (or absolute below 1). Exit 1 on any failure. Takes about a second.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fused  # noqa: E402
import needle2  # noqa: E402

TOL = 1e-5


def grads(f, inputs, g):
    xs = [x.clone().requires_grad_() for x in inputs]
    y = f(*xs)
    y.backward(g.to(y.dtype))
    return y.detach().double(), [x.grad.double() for x in xs]


def compare(name, fast, ref, inputs, g):
    y, gs = grads(fast, inputs, g)
    y0, g0s = grads(ref, [x.double() for x in inputs], g)
    # relative to each tensor's largest magnitude: a lane-mix gradient is a sum of D products
    err = max(float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
              for a, b in zip([y] + gs, [y0] + g0s))
    print("%-34s max relative diff %.1e" % (name, err))
    return err <= TOL


def main():
    torch.manual_seed(1)
    ok = True
    for N, n, scale in ((1, 4, 1.0), (63, 4, 3.0), (200, 4, 1.0), (65, 3, 8.0), (70, 8, 2.0)):
        m, g = torch.randn(N, n, n) * scale, torch.randn(N, n, n)
        ok &= compare("sinkhorn N=%d n=%d scale %g" % (N, n, scale), fused.sinkhorn,
                      needle2.sinkhorn_reference, [m], g)
        P = needle2.sinkhorn_reference(m)
        X, G = torch.randn(N, n, 128), torch.randn(N, n, 128)
        ok &= compare("lane mix N=%d n=%d" % (N, n), fused.lane_mix, lambda p, x: p @ x, [P, X], G)
    # the first layer's lanes: one row expanded over the n lanes (a stride-0 view)
    P = needle2.sinkhorn_reference(torch.randn(40, 4, 4))
    E, G = torch.randn(40, 1, 64), torch.randn(40, 4, 64)
    ok &= compare("lane mix, expanded X", lambda p, e: fused.lane_mix(p, e.expand(-1, 4, -1)),
                  lambda p, e: p @ e.expand(-1, 4, -1), [P, E], G)
    try:
        fused.sinkhorn(torch.zeros(3, 9, 9))
        ok = False
        print("n = 9 was accepted")
    except RuntimeError:
        pass
    print("fused: ok" if ok else "fused: FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
