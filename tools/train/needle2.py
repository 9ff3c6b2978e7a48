"""Needle 2 in PyTorch, written from ../../shared/spec/model-v2.md (the training path).

The forward pass runs whole sequences [B, S] from position 0 (the engine's decode form of §3,
batched over positions as §6 allows): mHC lanes with Sinkhorn routing, Engram hashed n-gram
memory at its sites, gated GQA with per-head ZCRMS + half-split RoPE and a sliding window,
and the HadamardMLP. Parameters are kept in the container's canonical order (container-v2.md
§5.1) so export and import are positional, like the format itself.
"""

import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import fused

# NEEDLE_TRAIN_FUSED=1 (train.sh FUSED=1): Sinkhorn and the lane mix through fused.c. Off by
# default, as in train.sh: the PyTorch ops are the numerics the shipped model was trained with.
FUSED = os.environ.get("NEEDLE_TRAIN_FUSED", "0") == "1"

ENGRAM_SEED = 0x9E3779B9
ENGRAM_PRIME = 0x01000193
MASK32 = 0xFFFFFFFF


def next_pow2(d):
    p = 1
    while p < d:
        p <<= 1
    return p


class Geometry:
    """Header geometry (container-v2.md §2). engram_heads = tables per order."""

    def __init__(self, vocab_size=1024, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4,
                 head_dim=32, max_seq_len=512, kv_window=256, mhc_lanes=4, engram_slots=257,
                 engram_sub_dim=64, engram_heads=1, engram_orders=(2, 3), engram_sites=(1, 2),
                 engram_conv_taps=4, rope_theta=10000.0):
        self.vocab_size, self.d_model = vocab_size, d_model
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.num_layers, self.max_seq_len, self.kv_window = num_layers, max_seq_len, kv_window
        self.mhc_lanes, self.engram_slots, self.engram_sub_dim = mhc_lanes, engram_slots, engram_sub_dim
        self.engram_heads, self.engram_orders = engram_heads, list(engram_orders)
        self.engram_sites, self.engram_conv_taps = list(engram_sites), engram_conv_taps
        self.rope_theta = float(rope_theta)

    @classmethod
    def from_header(cls, h):
        return cls(vocab_size=h["vocab_size"], d_model=h["d_model"], num_heads=h["num_heads"],
                   num_kv_heads=h["num_kv_heads"], num_layers=h["num_layers"],
                   head_dim=h["head_dim"], max_seq_len=h["max_seq_len"],
                   kv_window=h["kv_window"], mhc_lanes=h["mhc_lanes"],
                   engram_slots=h["engram_slots"], engram_sub_dim=h["engram_sub_dim"],
                   engram_heads=h["num_engram_tables"] // h["num_engram_orders"],
                   engram_orders=h["engram_orders"], engram_sites=h["engram_sites"],
                   engram_conv_taps=h["engram_conv_taps"], rope_theta=h["rope_theta"])

    def as_dict(self):
        return dict(self.__dict__)

    @property
    def tables(self):
        return self.engram_heads * len(self.engram_orders)

    def window(self):
        """Effective window W of model-v2.md §4.2 (0 = full causal)."""
        W, T = self.kv_window, self.max_seq_len
        if W == 0:
            kv = self.num_kv_heads * self.head_dim
            D, S, L = self.d_model, len(self.engram_sites), self.num_layers
            per_pos = L * (2 * kv + 2 * (kv // 32) * 4) + S * (D + (D // 32) * 4)
            W = max(160, min((12058624 // per_pos) // 32 * 32, T))
        return 0 if W >= T else W

    def canon(self):
        """[(name, shape, kind)] in container order (§5.1); kind: 'cq' or 'f16' plus a class
        used by the bits map ('embedding', 'mhc', 'default')."""
        g = self
        D, V, L, n, hd = g.d_model, g.vocab_size, g.num_layers, g.mhc_lanes, g.head_dim
        A, Kd, Nh = g.num_heads * hd, g.num_kv_heads * hd, next_pow2(D)
        out = [("embedding", [V, D], "embedding")]
        for l in range(L):
            p = "layer%02d." % l
            out += [(p + "norm_in", [D], "f16"), (p + "q_proj", [A, D], "default"),
                    (p + "k_proj", [Kd, D], "default"), (p + "v_proj", [Kd, D], "default"),
                    (p + "q_norm", [hd], "f16"), (p + "k_norm", [hd], "f16"),
                    (p + "gate_proj", [A, D], "default"), (p + "out_proj", [D, A], "default"),
                    (p + "post_norm", [D], "f16"), (p + "attn_gate", [1], "f16"),
                    (p + "pre_hada", [D], "f16"), (p + "d1", [Nh], "f16"),
                    (p + "d2", [Nh], "f16"), (p + "d3", [Nh], "f16")]
        out += [("mhc_a_pre", [L], "f16"), ("mhc_a_post", [L], "f16"), ("mhc_a_res", [L], "f16"),
                ("mhc_b_pre", [L, n], "f16"), ("mhc_b_post", [L, n], "f16"),
                ("mhc_b_res", [L, n, n], "f16"), ("mhc_phi_pre", [L * n, n * D], "mhc"),
                ("mhc_phi_post", [L * n, n * D], "mhc"), ("mhc_phi_res", [L * n * n, n * D], "mhc")]
        T, sub = g.tables, g.engram_sub_dim
        for s in range(len(g.engram_sites)):
            p = "engram%d." % s
            out += [(p + "tables", [T * g.engram_slots, sub], "default"),
                    (p + "key_proj", [D, T * sub], "default"),
                    (p + "value_proj", [D, T * sub], "default"),
                    (p + "taps", [g.engram_conv_taps, D], "f16")]
        out.append(("final_norm", [D], "f16"))
        return out


def zcrms(x, gamma):
    """Zero-centred RMSNorm (model-v2.md §2): (1 + γ) x / sqrt(mean(x²) + 1e-6)."""
    return (1.0 + gamma) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def rms_unit(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def hadamard(m):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < m:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(m)).float()


def engram_indices(tokens, g):
    """Hash rows and validity per position and table (model-v2.md §2.4).

    tokens: int64 [B, S] from position 0 -> idx int64 [B, S, T], valid bool [S, T]."""
    B, S = tokens.shape
    heads = g.engram_heads
    idx, valid = [], []
    pos = torch.arange(S)
    for tau in range(g.tables):
        o = g.engram_orders[tau // heads]
        acc = torch.full((B, S), (ENGRAM_SEED * (tau + 1)) & MASK32, dtype=torch.int64)
        for j in range(o):
            prev = F.pad(tokens, (j, 0))[:, :S]  # tok(p - j), 0 before the start
            acc = ((acc ^ prev) * ENGRAM_PRIME) & MASK32
        acc = acc ^ (acc >> 15)
        idx.append(acc % g.engram_slots + tau * g.engram_slots)
        valid.append(pos >= o - 1)
    return torch.stack(idx, -1), torch.stack(valid, -1)


class Packing:
    """Where the real tokens of a padded [B, S] segment sit: rows b hold count[b] tokens
    from their start. pack: [B, S, ...] -> [N, ...] (row-major), pad: the inverse (zeros at
    padded places); pos: each packed token's absolute position."""

    def __init__(self, count, S, pos0):
        self.B, self.S = len(count), S
        self.count = count.clamp(0, S)
        keep = torch.arange(S)[None, :] < self.count[:, None]
        self.bi, self.si = keep.nonzero(as_tuple=True)
        self.full = bool(keep.all())
        self.pos = self.si + pos0

    def pack(self, x):
        return x.reshape(self.B * self.S, *x.shape[2:]) if self.full else x[self.bi, self.si]

    def pad(self, x):
        if self.full:
            return x.reshape(self.B, self.S, *x.shape[1:])
        out = x.new_zeros(self.B, self.S, *x.shape[1:])
        return out.index_put((self.bi, self.si), x)


def sinkhorn_reference(m, iters=20):
    """Log-domain Sinkhorn, rows then columns, exponentiated once (model-v2.md §2.2)."""
    for _ in range(iters):
        m = m - torch.logsumexp(m, -1, keepdim=True)
        m = m - torch.logsumexp(m, -2, keepdim=True)
    return torch.exp(m)


def sinkhorn(m, iters=20):
    """sinkhorn_reference, or with NEEDLE_TRAIN_FUSED=1 one fused C call per direction (fused.py:
    ~7x faster forward, ~3x backward; equal to float rounding, so training takes other roundings
    and ends in another model). The same switch selects the lane mix of Needle2.layer."""
    if FUSED:
        return fused.sinkhorn(m, iters)
    return sinkhorn_reference(m, iters)


class Needle2(nn.Module):
    def __init__(self, g):
        super().__init__()
        self.g = g
        self.names = [name for name, _, _ in g.canon()]
        self.params = nn.ParameterList(
            [nn.Parameter(torch.zeros(shape)) for _, shape, _ in g.canon()])
        self.index = {name: i for i, name in enumerate(self.names)}
        Nh = next_pow2(g.d_model)
        self.register_buffer("had", hadamard(Nh), persistent=False)
        half = g.head_dim // 2
        # inv_freq in float32 exactly as §2.1: (2i)/hd, powf, reciprocal; angle a f32 product.
        expo = (torch.arange(half, dtype=torch.float32) * 2) / g.head_dim
        inv = 1.0 / torch.pow(torch.tensor(g.rope_theta, dtype=torch.float32), expo)
        ang = torch.arange(g.max_seq_len, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cos(ang.double()).float(), persistent=False)
        self.register_buffer("sin", torch.sin(ang.double()).float(), persistent=False)

    def p(self, name):
        return self.params[self.index[name]]

    # ------------------------------------------------------------------ initialisation

    def init_weights(self, seed):
        """Training init: matrices N(0, 1/in), gammas 0, diagonals near 1, lanes near identity
        routing (the ±4 offsets of §5.2/5.7 already favour lane l mod n)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for (name, shape, kind), prm in zip(self.g.canon(), self.params):
                leaf = name.split(".")[-1]
                if kind != "f16":
                    std = 1.0 / math.sqrt(shape[1])
                    if leaf == "tables":
                        std = 0.5
                    elif name.startswith("mhc_phi"):
                        std = 0.1 / math.sqrt(shape[1])
                    prm.copy_(torch.randn(shape, generator=gen) * std)
                elif leaf in ("d1", "d2", "d3"):  # near-identity diagonals: unit-gain MLP
                    prm.copy_(1.0 + 0.02 * torch.randn(shape, generator=gen))
                elif leaf == "attn_gate":
                    prm.fill_(0.0)
                elif leaf == "taps":
                    prm.copy_(0.1 * torch.randn(shape, generator=gen))
                elif name.startswith("mhc_a"):
                    prm.fill_(0.5)
                else:  # norms, b_pre/b_post/b_res
                    prm.zero_()

    def load_arrays(self, arrays):
        """Copies float arrays (canonical order, e.g. a dequantised container) into the model."""
        with torch.no_grad():
            for prm, a in zip(self.params, arrays):
                prm.copy_(torch.as_tensor(np.asarray(a, np.float32)).reshape(prm.shape))

    def arrays(self):
        return [prm.detach().cpu().numpy().astype(np.float32) for prm in self.params]

    # ------------------------------------------------------------------ forward

    def hmlp(self, h, l):
        D, Nh = self.g.d_model, self.had.shape[0]
        z = F.pad(h, (0, Nh - D))
        z = (self.p("layer%02d.d1" % l) * z) @ self.had
        z = F.silu(self.p("layer%02d.d2" % l) * z) @ self.had
        return (self.p("layer%02d.d3" % l) * z)[..., :D]

    def rope(self, x, pos):
        """x [N, heads, hd] at positions pos [N]; pairs (i, i + hd/2) (§2.1)."""
        half = x.shape[-1] // 2
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    def attention(self, bx, l, pos0, prev, W, pk):
        """Attention sub-block (§5.5) for the packed tokens bx [N, D] of a segment at positions
        pos0.. (pk = Packing: where each token sits in the padded [B, S] grid); prev = (k, v)
        of positions 0..pos0-1 (batch 1 or B) or None. Scores run on the padded grid (a
        padded key sits after every real query of its row, so the causal mask hides it).
        Returns x1 [N, D] and this segment's padded (k, v)."""
        g, pre = self.g, "layer%02d." % l
        H, K, hd = g.num_heads, g.num_kv_heads, g.head_dim
        B, S = pk.B, pk.S
        hA = zcrms(bx, self.p(pre + "norm_in"))
        q = (hA @ self.p(pre + "q_proj").t()).view(-1, H, hd)
        k = (hA @ self.p(pre + "k_proj").t()).view(-1, K, hd)
        v = (hA @ self.p(pre + "v_proj").t()).view(-1, K, hd)
        gl = hA @ self.p(pre + "gate_proj").t()
        q = self.rope(zcrms(q, self.p(pre + "q_norm")), pk.pos)
        k = pk.pad(self.rope(zcrms(k, self.p(pre + "k_norm")), pk.pos))
        v = pk.pad(v)
        own = (k, v)
        if prev is not None and prev[0].shape[0] == 1 and B > 1:
            o = self.attend_grouped(q, k, v, prev, pos0, W, pk)
            att = (o * torch.sigmoid(gl)) @ self.p(pre + "out_proj").t()
            x1 = bx + torch.sigmoid(self.p(pre + "attn_gate")) * zcrms(att, self.p(pre + "post_norm"))
            return x1, own
        q = pk.pad(q)
        if prev is not None:
            k = torch.cat([prev[0].expand(B, -1, -1, -1), k], 1)
            v = torch.cat([prev[1].expand(B, -1, -1, -1), v], 1)
        qp = torch.arange(pos0, pos0 + S)[:, None]
        kp = torch.arange(pos0 + S - k.shape[1], pos0 + S)[None, :]
        mask = kp <= qp
        if W > 0:
            mask = mask & (qp - kp < W)
        rep = H // K  # query heads r -> KV head r // rep
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v).reshape(B, S, H * hd)
        o = pk.pack(o)
        att = (o * torch.sigmoid(gl)) @ self.p(pre + "out_proj").t()
        x1 = bx + torch.sigmoid(self.p(pre + "attn_gate")) * zcrms(att, self.p(pre + "post_norm"))
        return x1, own

    @classmethod
    def attend_grouped(cls, q, k, v, prev, pos0, W, pk, rows=8):
        """attend_shared over groups of `rows` consecutive rows, each on a grid as long as its
        longest row: the own-key scores cost B * S^2 on one grid, and a batch's longest row is
        ~2x its mean (4x the work). Callers order rows longest first (train.Examples) so that
        a group's rows are of similar length. The same numbers per query."""
        if pk.B <= rows:
            return cls.attend_shared(q, k, v, prev, pos0, W, pk)
        out, n0 = [], 0
        for b0 in range(0, pk.B, rows):
            cnt = pk.count[b0:b0 + rows]
            Sg, n1 = int(cnt.max()), n0 + int(cnt.sum())
            sub = Packing(cnt, Sg, pos0)
            out.append(cls.attend_shared(q[n0:n1], k[b0:b0 + rows, :Sg], v[b0:b0 + rows, :Sg],
                                         prev, pos0, W, sub))
            n0 = n1
        return torch.cat(out)

    @staticmethod
    def attend_shared(q, k, v, prev, pos0, W, pk):
        """Attention of the packed queries q [N, H, hd] (pk: their rows and positions) over a
        prefix shared by every row (prev = k, v [1, P, K, hd] of positions 0..P-1) and their
        own row's padded k, v [B, S, K, hd]; returns [N, H * hd]. The same numbers as
        attending over the concatenated keys (up to summation order), but the prefix part is
        one large matmul per KV head over the real queries only: on CPU the batched small
        GEMMs of the concatenated form, and padded queries, took most of a training step."""
        N, H, hd = q.shape
        B, S, K = k.shape[0], k.shape[1], k.shape[2]
        P, rep = prev[0].shape[1], H // K  # query head h -> KV head h // rep
        scale = 1.0 / math.sqrt(hd)
        qh = q.view(N, K, rep, hd).permute(1, 2, 0, 3)  # [K, rep, N, hd]
        kp = prev[0][0].permute(1, 2, 0)  # [K, hd, P]
        vp = prev[1][0].permute(1, 0, 2)  # [K, P, hd]
        s_pre = (qh.reshape(K, rep * N, hd) @ kp).view(K, rep, N, P) * scale
        if W > 0:
            s_pre = s_pre.masked_fill(pk.pos[:, None] - torch.arange(pos0 - P, pos0)[None, :]
                                      >= W, float("-inf"))
        # own keys: scores on the padded grid [K, B, rep, S, S], then the real query rows
        qg = pk.pad(q).view(B, S, K, rep, hd).permute(2, 0, 3, 1, 4)
        s_own = (qg @ k.permute(2, 0, 3, 1)[:, :, None]) * scale
        qp = torch.arange(pos0, pos0 + S)[:, None]
        kp_own = torch.arange(pos0, pos0 + S)[None, :]
        mask = kp_own <= qp
        if W > 0:
            mask = mask & (qp - kp_own < W)
        s_own = s_own.masked_fill(~mask, float("-inf"))
        s_own = pk.pack(s_own.permute(1, 3, 0, 2, 4)).permute(1, 2, 0, 3)  # [K, rep, N, S]
        a = torch.softmax(torch.cat([s_pre, s_own], -1), -1)
        # split, not two slices: a slice's backward zero-fills a full-size gradient and adds.
        a_pre, a_own = a.split([P, S], -1)
        o_pre = (a_pre.reshape(K, rep * N, P) @ vp).view(K, rep, N, hd).permute(2, 0, 1, 3)
        a_own = pk.pad(a_own.permute(2, 0, 1, 3)).permute(2, 0, 3, 1, 4)  # [K, B, rep, S, S]
        o_own = pk.pack((a_own @ v.permute(2, 0, 1, 3)[:, :, None]).permute(1, 3, 0, 2, 4))
        return (o_pre + o_own).reshape(N, H * hd)

    def engram(self, tokens, pos0):
        """Per site: keys ek and convolved values ev for positions pos0.. of the full token
        rows `tokens` [B, S] (model-v2.md §3 step 3), [B, S - pos0, D] each."""
        g = self.g
        idx, valid = engram_indices(tokens, g)
        B, S = tokens.shape
        dil = max(g.engram_orders)
        lo = max(0, pos0 - dil * (g.engram_conv_taps - 1))  # earliest position a tap reads
        idx, valid = idx[:, lo:], valid[lo:]
        out = []
        for s in range(len(g.engram_sites)):
            pre = "engram%d." % s
            f = self.p(pre + "tables")[idx] * valid[None, :, :, None].float()  # [B,S',T,sub]
            f = f.reshape(B, S - lo, -1)
            ek = f @ self.p(pre + "key_proj").t()
            vraw = f @ self.p(pre + "value_proj").t()
            taps = self.p(pre + "taps")
            ev = 0
            for j in range(g.engram_conv_taps):
                shifted = F.pad(vraw, (0, 0, j * dil, 0))[:, :S - lo]  # vraw(p - j*dil)
                ev = ev + taps[j] * shifted
            out.append((ek[:, pos0 - lo:], ev[:, pos0 - lo:]))
        return out

    def layer(self, X, l, eng, pos0, prev, W, pk):
        """One layer (§5.1-5.9) on the packed lanes X [N, n, D] of a segment at positions
        pos0..; returns the new lanes and this segment's (k, v)."""
        g = self.g
        N, n, D = X.shape
        lane = torch.arange(n)
        xh = rms_unit(X.reshape(N, n * D))
        a = xh @ self.p("mhc_phi_pre")[l * n:(l + 1) * n].t()
        off_pre = torch.where(lane == l % n, 4.0, -4.0)
        hpre = torch.sigmoid(self.p("mhc_a_pre")[l] * a + self.p("mhc_b_pre")[l] + off_pre)
        u = (hpre[..., None] * X).sum(1)  # Σ_i hpre[i] X[i] (a [1, n] @ [n, D] bmm is slower)
        bx = u
        if l in g.engram_sites:
            ek, ev = eng[g.engram_sites.index(l)]
            alpha = torch.sigmoid((rms_unit(u) * rms_unit(ek)).sum(-1, keepdim=True)
                                  / np.float32(math.sqrt(D)))
            bx = u + alpha * ev
        x1, kv = self.attention(bx, l, pos0, prev, W, pk)
        x2 = x1 + self.hmlp(zcrms(x1, self.p("layer%02d.pre_hada" % l)), l)
        y = x2 - u  # not bx: the Engram term stays in y (§10 item 1)
        b = xh @ self.p("mhc_phi_post")[l * n:(l + 1) * n].t()
        off_post = torch.where(lane == l % n, 0.0, -4.0)
        hpost = 2 * torch.sigmoid(self.p("mhc_a_post")[l] * b + self.p("mhc_b_post")[l] + off_post)
        rv = xh @ self.p("mhc_phi_res")[l * n * n:(l + 1) * n * n].t()
        M = self.p("mhc_a_res")[l] * rv.view(N, n, n) + self.p("mhc_b_res")[l]
        P = sinkhorn(M)
        # Σ_j P[i][j] X[j] as an [n, n] @ [n, D] matmul per token (fused.lane_mix: PyTorch's
        # CPU bmm makes one tiny GEMM call per token, ~6x slower forward and backward).
        mixed = fused.lane_mix(P, X) if FUSED else P @ X
        X = mixed + hpost[..., None] * y[:, None, :]
        return X, kv

    def hidden(self, tokens, window=None, prefix=0, lengths=None):
        """Final-normed hidden states [B, S - prefix, D] of positions prefix.. .

        tokens int64 [B, S] from position 0. prefix > 0 says every row shares its first
        `prefix` tokens (the prompt's tools block): they run once, as a batch of 1, and the
        rows attend to their keys (the same numbers as running every row in full).
        lengths [B] (optional): row b's tokens end there (padding after); everything but the
        attention scores and the Engram convolution then runs on the real tokens only, and
        padded positions come back as zeros."""
        g = self.g
        D, n = g.d_model, g.mhc_lanes
        W = g.window() if window is None else window
        B, S = tokens.shape
        lengths = torch.full((B,), S) if lengths is None else torch.as_tensor(lengths)
        segments = [(tokens[:1, :prefix], 0), (tokens[:, prefix:], prefix)] if prefix else \
            [(tokens, 0)]
        prev = [None] * g.num_layers
        for seg, pos0 in segments:
            Bs, Ss = seg.shape
            pk = Packing(lengths[:Bs] - pos0, Ss, pos0)
            e0 = self.p("embedding")[pk.pack(seg)] * np.float32(math.sqrt(D))
            eng = [(pk.pack(ek), pk.pack(ev)) for ek, ev in
                   self.engram(tokens[:Bs, :pos0 + Ss], pos0)] if g.engram_sites else []
            X = e0[:, None, :].expand(-1, n, D)
            for l in range(g.num_layers):
                X, kv = self.layer(X, l, eng, pos0, prev[l], W, pk)
                if pos0 == 0:
                    prev[l] = kv  # the shared prefix's keys for the rows' segment
        return pk.pad(zcrms(X.mean(1), self.p("final_norm")))

    def forward(self, tokens, window=None, prefix=0):
        """tokens int64 [B, S] (positions 0..S-1) -> logits [B, S - prefix, V]. window: None
        = the header's effective window, 0 = full causal."""
        return self.hidden(tokens, window, prefix) @ self.p("embedding").t()
