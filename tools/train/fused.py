"""Fused kernels for training (fused.c), built on first use with the system C compiler and called
through ctypes: Debian's PyTorch 1.13 has no torch.compile, and ~280 tiny kernels per layer for
Sinkhorn's 20 iterations cost about a fifth of a training step.

sinkhorn(m) is needle2.sinkhorn_reference(m) (model-v2.md §2.2) to float rounding, forward and
backward (tools/train/test_fused.py). The library is cached under build/train-fused/ by a hash
of the source and flags; -march=native, so a result depends on the machine's ISA, as PyTorch's
OpenBLAS kernels already make it.
"""

import ctypes
import hashlib
import os
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "fused.c")
CACHE = os.path.join(HERE, "..", "..", "build", "train-fused")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC", "-shared", "-std=c11"]

_lib = None


def library():
    """The compiled fused.c (built once per source and flags; safe for concurrent ranks)."""
    global _lib
    if _lib is not None:
        return _lib
    src = open(SRC, "rb").read()
    tag = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, "fused-%s.so" % tag)
    if not os.path.exists(path):
        cc = os.environ.get("CC", "cc")
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=CACHE)
        os.close(fd)
        subprocess.run([cc] + FLAGS + ["-o", tmp, SRC, "-lm"], check=True)
        os.replace(tmp, path)  # atomic: another rank may have built the same file meanwhile
    lib = ctypes.CDLL(path)
    for name, nargs in (("needle_train_sinkhorn_forward", 2), ("needle_train_sinkhorn_backward", 3),
                        ("needle_train_lane_mix_forward", 3), ("needle_train_lane_mix_backward", 5)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    _lib = lib
    return lib


def _check(status, what):
    if status != 0:
        raise RuntimeError("fused.c %s failed with %d" % (what, status))


class _Sinkhorn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, iters):
        m = m.detach().to(torch.float32).contiguous()
        p = torch.empty_like(m)
        N, n = m.shape[0], m.shape[-1]
        _check(library().needle_train_sinkhorn_forward(m.data_ptr(), p.data_ptr(), N, n, iters),
               "sinkhorn forward")
        ctx.save_for_backward(m)
        ctx.iters = iters
        return p

    @staticmethod
    def backward(ctx, gp):
        (m,) = ctx.saved_tensors
        gp = gp.to(torch.float32).contiguous()
        gm = torch.empty_like(m)
        _check(library().needle_train_sinkhorn_backward(
            m.data_ptr(), gp.data_ptr(), gm.data_ptr(), m.shape[0], m.shape[-1], ctx.iters),
            "sinkhorn backward")
        return gm, None


def sinkhorn(m, iters=20):
    """m [N, n, n] float32 (n <= 8) -> the doubly stochastic [N, n, n], differentiable."""
    if m.dim() != 3 or m.shape[1] != m.shape[2]:
        raise ValueError("sinkhorn wants [N, n, n], got %s" % (tuple(m.shape),))
    return _Sinkhorn.apply(m, iters)


class _LaneMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, P, X):
        P = P.detach().to(torch.float32).contiguous()
        X = X.detach().to(torch.float32).contiguous()
        out = torch.empty_like(X)
        N, n, D = X.shape
        _check(library().needle_train_lane_mix_forward(P.data_ptr(), X.data_ptr(), out.data_ptr(),
                                                       N, n, D), "lane mix forward")
        ctx.save_for_backward(P, X)
        return out

    @staticmethod
    def backward(ctx, G):
        P, X = ctx.saved_tensors
        G = G.to(torch.float32).contiguous()
        gP, gX = torch.empty_like(P), torch.empty_like(X)
        N, n, D = X.shape
        _check(library().needle_train_lane_mix_backward(P.data_ptr(), X.data_ptr(), G.data_ptr(),
                                                        gP.data_ptr(), gX.data_ptr(), N, n, D),
               "lane mix backward")
        return gP, gX


def lane_mix(P, X):
    """P [N, n, n] @ X [N, n, D] per token (P @ X), differentiable in both."""
    if P.dim() != 3 or X.dim() != 3 or P.shape[0] != X.shape[0] or P.shape[1] != P.shape[2] or \
            P.shape[2] != X.shape[1] or P.shape[1] > 8:
        raise ValueError("lane_mix wants [N, n, n] and [N, n, D], got %s and %s" %
                         (tuple(P.shape), tuple(X.shape)))
    return _LaneMix.apply(P, X)
