// Private to the Needle 3 sources (needle3.cpp, needle3_heads.cpp): the sequence state and the
// chunk workspace of Needle3Model.
#pragma once

#include <vector>

#include "core/huge_pages.h"
#include "model/kv_layout.h"
#include "model/needle3.h"

namespace needle {

constexpr uint32_t kPrepAlign = 1024;  // any CQ group (<= 1024) divides it: one stride fits all

// Per-sequence histories (model-v3.md §3): per-layer KV rings, Q/K/V conv tails, the id history
// and Engram value tails, and the confidence pooling.
struct Needle3Model::Seq final : Sequence {
    KvType kv_type;
    std::vector<uint32_t> slots;    // [L] KV ring slots per layer: min(kvl.ring, limit)
    std::vector<KvLayout> kvl;      // [L] window, sinks and ring of the layer (kv_layout.h)
    std::vector<size_t> kv_off;     // [L] first K element of the layer (V follows its K)
    HugeVector<float> kv;           // f32: per layer K [G][slots][dq] then V [G][slots][dv]
    HugeVector<int8_t> kv8;         // int8: same layout (both read whole every step: 2 MB pages)
    std::vector<float> kv_scale;    // int8: per layer K scales [G][slots] then V [G][slots]
    std::vector<size_t> sc_off;     // [L]
    std::vector<float> tail;        // [L][T-1][qd + kd + vd] pre-conv projections, oldest first
    std::vector<uint32_t> hist;     // [limit] fed ids
    uint32_t vring = 1;             // Engram value ring rows: (Te-1)*dil + 1
    std::vector<float> eraw;        // [S][vring][d] pre-conv Engram values
    std::vector<float> pool;        // confidence: [cells*k][d + 2] numerator, running max, denominator
    mutable std::vector<float> conf_scratch;
    // Geometry the spans are cut by (visit_state).
    uint32_t G = 0, dq = 0, dv = 0, D = 0;
    // The histories need no clearing: every reader skips positions before 0 and the first
    // position re-initialises the confidence pooling.
    void reset() override { pos = 0; }
    void visit_state(uint32_t at, StateVisitor fn, void *ctx) override;
};

// Rows i0 .. i0+n-1 of a workspace hold positions p0 .. p0+n-1 of sequence *s: a prefill chunk
// is one part, a needle_decode_many step one part per sequence (n = 1 each). Row-wise work and
// the matmuls run over all rows at once; what reads a history (conv tails, KV ring, Engram tail,
// pooling) runs part by part.
struct Needle3Model::Part {
    Seq *s;
    uint32_t i0, n, p0;
};

// Chunk scratch: every pointer is [capacity][width] (strides are the widths).
struct Needle3Model::Work final : Workspace {
    std::vector<Part> parts;     // [capacity], filled by forward_many
    HugeVector<float> buf;       // every activation of a chunk (2 MB pages when that large)
    std::vector<uint32_t> hash;  // [cap][n_tables] slot, UINT32_MAX = n-gram not valid yet
    float *X, *Xs, *xh, *pa, *pb, *pr, *u, *bx, *t, *hh, *q, *k, *v, *gl, *qc, *kc, *vc, *o, *oh;
    float *att, *y, *z, *t1, *t2, *cv, *rb, *mlp, *f, *fh, *ek, *ev, *er, *cell, *rope;
    float *scores, *hf, *hfh;
    size_t pnd, pd, pod;  // prepared-input strides
    uint32_t max_rank;
};

}  // namespace needle
