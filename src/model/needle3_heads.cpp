// Needle 3 confidence probe head (model-v3.md §2.4, code 2): binding of the rung's cells,
// online pooling as positions are fed (no second pass, no stored cells) and the head output.
#include <algorithm>
#include <cmath>
#include <cstring>


#include "core/error.h"
#include "model/needle3_state.h"

namespace needle {

// The confidence head's cells of the rung (cell 0, then l+1 of each kept l), model-v3.md §5.
void Needle3Model::bind_confidence(const ContainerV3 &c, uint32_t b, Arena &ar, const CqTables &tb) {
    const Needle3Geometry &g = g_;
    const uint32_t all_cells = c.header.num_layers + 1;
    Needle3Confidence &h = conf_;
    const CqMatrix probes = bind_cq(c.tensors[b], tb, ar), query = bind_cq(c.tensors[b + 2], tb, ar);
    h.k = probes.rows / all_cells, h.Q = query.rows, h.cells = g.L + 1;
    std::vector<uint32_t> cells{0};
    for (uint32_t l : kept_) cells.push_back(l + 1);
    float *pr = ar.take(size_t(h.cells) * h.k * g.d), *gn = ar.take(size_t(h.cells) * h.k);
    float *rb = ar.take(size_t(h.Q) * h.cells * h.k), *qr = ar.take(size_t(h.Q) * g.d);
    std::vector<float> gain(float_count(c.tensors[b + 1])), bias(float_count(c.tensors[b + 3]));
    to_f32(c.tensors[b + 1], float_count(c.tensors[b + 1]), gain.data());
    to_f32(c.tensors[b + 3], float_count(c.tensors[b + 3]), bias.data());
    for (uint32_t ci = 0; ci < h.cells; ++ci)
        for (uint32_t j = 0; j < h.k; ++j) {
            const uint32_t src = cells[ci] * h.k + j, dst = ci * h.k + j;
            cq_dequantize_row(probes, src, pr + size_t(dst) * g.d);
            gn[dst] = gain[src];
            for (uint32_t q = 0; q < h.Q; ++q)
                rb[size_t(q) * h.cells * h.k + dst] = bias[(size_t(q) * all_cells + cells[ci]) * h.k + j];
        }
    for (uint32_t q = 0; q < h.Q; ++q) cq_dequantize_row(query, q, qr + size_t(q) * g.d);
    h.probes = pr, h.gain = gn, h.row_bias = rb, h.query = qr;
    h.proj = bind_cq(c.tensors[b + 4], tb, ar);
    float bias0 = 0.0f;
    to_f32(c.tensors[b + 5], 1, &bias0);
    h.bias = bias0;
    has_conf_ = true;
}

// §2.4: online position softmax of every (cell, probe) of this cell over the chunk, in
// position order: running max m, denominator s and numerator sum_t e^(score_t - m) c_t.
void Needle3Model::pool_cells(const Part &pa, Work &w, uint32_t cell) const {
    Seq &s = *pa.s;
    const uint32_t n = pa.n, i0 = pa.i0;
    if (!s.options.probe_heads) return;
    const Needle3Geometry &g = g_;
    const uint32_t k = conf_.k, D = g.d;
    const float inv_sqrt_d = 1.0f / std::sqrt(float(D));
    auto probe = [&](uint32_t j) {
        const uint32_t idx = cell * k + j;
        const float *pv = conf_.probes + size_t(idx) * D;
        float *acc = s.pool.data() + size_t(idx) * (D + 2), &m = acc[D], &den = acc[D + 1];
        for (uint32_t i = 0; i < n; ++i) {
            const float *c = w.cell + size_t(i0 + i) * D;
            float dot = 0.0f;
            for (uint32_t e = 0; e < D; ++e) dot += c[e] * pv[e];
            const float sc = dot * inv_sqrt_d;
            if (pa.p0 + i == 0) {
                m = sc, den = 0.0f;
                std::fill(acc, acc + D, 0.0f);
            } else if (sc > m) {
                const float f = std::exp(m - sc);
                for (uint32_t e = 0; e < D; ++e) acc[e] *= f;
                den *= f, m = sc;
            }
            const float wt = std::exp(sc - m);
            den += wt;
            for (uint32_t e = 0; e < D; ++e) acc[e] += wt * c[e];
        }
    };
    if (n * k * D >= (1u << 14)) parallel_for(0, k, 1, [&](uint32_t b, uint32_t e) { for (uint32_t j = b; j < e; ++j) probe(j); });
    else
        for (uint32_t j = 0; j < k; ++j) probe(j);
}

uint32_t Needle3Model::probe_head_dim(ProbeHead h) const {
    return h == ProbeHead::Confidence && has_conf_ ? 1 : 0;
}

// The head output of §2.4 over the pooled positions: R = gain * unit(pooled), per query a
// softmax over (cell, probe), then proj . concat(P_q) + bias.
void Needle3Model::probe_head_output(const Sequence &seq, ProbeHead which, float *result) const {
    const Seq &s = static_cast<const Seq &>(seq);
    if (which != ProbeHead::Confidence || !has_conf_)
        fail(NEEDLE_E_UNSUPPORTED, which == ProbeHead::Confidence ? "this model has no confidence head"
                                                                  : "this model has no contrastive head");
    if (!s.options.probe_heads)
        fail(NEEDLE_E_UNSUPPORTED, "this state does not pool the probe heads (created with needle_state_params.probe_heads 0)");
    if (s.pos == 0) fail(NEEDLE_E_INVALID_ARGUMENT, "no token has been fed yet");
    const Needle3Geometry &g = g_;
    const uint32_t D = g.d, CK = conf_.cells * conf_.k, Q = conf_.Q;
    float *R = s.conf_scratch.data(), *beta = R + size_t(CK) * D, *P = beta + CK;
    float *Ph = P + round_up(Q * D, kPrepAlign);
    for (uint32_t idx = 0; idx < CK; ++idx) {
        const float *acc = s.pool.data() + size_t(idx) * (D + 2);
        float *r = R + size_t(idx) * D;
        for (uint32_t e = 0; e < D; ++e) r[e] = acc[e] / acc[D + 1];
        rms_unit(r, D, r);
        for (uint32_t e = 0; e < D; ++e) r[e] *= conf_.gain[idx];
    }
    const float inv_sqrt_d = 1.0f / std::sqrt(float(D));
    for (uint32_t q = 0; q < Q; ++q) {
        const float *qv = conf_.query + size_t(q) * D;
        float mx = -INFINITY, sum = 0.0f;
        for (uint32_t idx = 0; idx < CK; ++idx) {
            float dot = 0.0f;
            for (uint32_t e = 0; e < D; ++e) dot += R[size_t(idx) * D + e] * qv[e];
            beta[idx] = dot * inv_sqrt_d + conf_.row_bias[size_t(q) * CK + idx];
            mx = std::max(mx, beta[idx]);
        }
        for (uint32_t idx = 0; idx < CK; ++idx) sum += (beta[idx] = std::exp(beta[idx] - mx));
        float *pq = P + size_t(q) * D;
        std::fill(pq, pq + D, 0.0f);
        for (uint32_t idx = 0; idx < CK; ++idx) {
            const float b = beta[idx] / sum;
            for (uint32_t e = 0; e < D; ++e) pq[e] += b * R[size_t(idx) * D + e];
        }
    }
    cq_prepare_input(P, Q * D, conf_.proj.cols_pad, conf_.proj.group, Ph);
    float out = 0.0f;
    cq_matmul(conf_.proj, Ph, conf_.proj.cols_pad, 1, 0, 1, &out, 1);
    *result = out + conf_.bias;
}

}  // namespace needle
