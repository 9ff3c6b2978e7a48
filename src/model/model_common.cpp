// Shared model pieces (model_common.h).
#include "model/model_common.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/f16.h"
#include "model/model.h"

namespace needle {

void Arena::reset(size_t n) {
    constexpr size_t kHugeFloats = (size_t(2) << 20) / sizeof(float);
    HugeVector<float>().swap(v_);
    used_ = 0;
    if (n >= kHugeFloats / 2) v_.reserve((n + kHugeFloats - 1) / kHugeFloats * kHugeFloats);
    v_.assign(n, 0.0f);
}

float *Arena::take(size_t n) {
    if (used_ + n > v_.size()) fail(NEEDLE_E_INTERNAL, "arena sized too small");
    float *p = v_.data() + used_;
    used_ += n;
    return p;
}

void block_matmul_weights(const std::vector<CqMatrix *> &mats, bool fast, CqBlockStore &store) {
    for (CqMatrix *m : mats) m->fast = fast;
    // cq_matmul then no longer reads their stored indices; load_model drops the file's pages
    // from the RSS in one call at the end (one call per matrix cost a TLB flush each: ~0.25 ms
    // apiece in a VM with shadow paging, 30 ms for needle2's 143 matrices).
    cq_block_matrices(mats.data(), mats.size(), store);
}

uint64_t elements(const TensorRecord &t) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return n;
}

void to_f32(const TensorRecord &t, uint64_t n, float *out) {
    if (t.dtype == DType::F32) {
        std::memcpy(out, t.data, n * 4);
        return;
    }
    f16_to_f32_n(t.data, n, out);
}

void set_ternary_group(CqTables &t, uint32_t group, Arena &ar) {
    // Unit Lloyd-Max level of a ternary trit, divided in double and rounded once (v2 §7.3).
    const float tl = float(1.2240064 / std::sqrt(double(group)));
    float *lvt = ar.take(4), *lutt = ar.take(1024);
    lvt[0] = 0.0f, lvt[1] = tl, lvt[2] = 0.0f, lvt[3] = -tl;
    for (uint32_t byte = 0; byte < 256; ++byte)
        for (uint32_t k = 0; k < 4; ++k) lutt[byte * 4 + k] = lvt[(byte >> (2 * k)) & 3u];
    t.lvt = lvt, t.lutt = lutt;
}

CqTables make_cq_tables(const float *codebook, uint32_t ternary_group, Arena &ar) {
    CqTables t{};
    float *lv2 = ar.take(4), *lv3 = ar.take(8), *lv4 = ar.take(16);
    std::memcpy(lv2, codebook, 16), std::memcpy(lv3, codebook + 4, 32);
    std::memcpy(lv4, codebook + 12, 64);
    float *lut2 = ar.take(1024), *lut4 = ar.take(512);
    for (uint32_t byte = 0; byte < 256; ++byte) {
        for (uint32_t k = 0; k < 4; ++k) lut2[byte * 4 + k] = lv2[(byte >> (2 * k)) & 3u];
        for (uint32_t k = 0; k < 2; ++k) lut4[byte * 2 + k] = lv4[(byte >> (4 * k)) & 15u];
    }
    t.lv2 = lv2, t.lv3 = lv3, t.lv4 = lv4, t.lut2 = lut2, t.lut4 = lut4;
    set_ternary_group(t, ternary_group, ar);
    return t;
}

CqMatrix bind_cq(const TensorRecord &t, const CqTables &tb, Arena &ar) {
    CqMatrix m;
    const uint32_t bits = t.bits & 0xffu;
    m.rows = t.shape[0], m.cols = t.shape[1], m.group = t.group;
    m.cols_pad = round_up(m.cols, m.group), m.ngroups = m.cols_pad / m.group;
    m.width = bits == 5 ? 2 : bits;
    m.row_bytes = m.cols_pad * m.width / 8;
    m.packed = t.data;
    switch (bits) {
    case 2: m.lut = tb.lut2, m.levels = tb.lv2; break;
    case 3: m.lut = nullptr, m.levels = tb.lv3; break;
    case 4: m.lut = tb.lut4, m.levels = tb.lv4; break;
    default: m.lut = tb.lutt, m.levels = tb.lvt; break;
    }
    float *nrm = ar.take(size_t(m.rows) * m.ngroups);
    f16_to_f32_n(t.data + size_t(m.rows) * m.row_bytes, size_t(m.rows) * m.ngroups, nrm);
    m.norms = nrm;
    return m;
}

void engram_conv_at(uint32_t p, uint32_t p0, uint32_t n_taps, uint32_t dil, uint32_t order_gate,
                    const float *taps, const float *chunk, size_t chunk_stride, const float *ring,
                    uint32_t ring_rows, uint32_t d, float *ev) {
    std::fill(ev, ev + d, 0.0f);
    for (uint32_t j = 0; j < n_taps && j * dil <= p && p >= j * order_gate; ++j) {
        const uint32_t q = p - j * dil;
        const float *src = q >= p0 ? chunk + size_t(q - p0) * chunk_stride : ring + size_t(q % ring_rows) * d;
        const float *tap = taps + size_t(j) * d;
        for (uint32_t c = 0; c < d; ++c) ev[c] += tap[c] * src[c];
    }
}

void engram_ring_store(uint32_t p0, uint32_t n, const float *chunk, size_t chunk_stride, float *ring,
                       uint32_t ring_rows, uint32_t d) {
    for (uint32_t i = (n > ring_rows ? n - ring_rows : 0); i < n; ++i)
        std::memcpy(ring + size_t((p0 + i) % ring_rows) * d, chunk + i * chunk_stride, sizeof(float) * d);
}

void mhc_routing(float a_res, const float *b_res, uint32_t N, uint32_t n, float *p_res) {
    const uint32_t NN = N * N;
    constexpr uint32_t kGroup = 8;  // matrices per kernel call: enough to interleave
    for_positions((n + kGroup - 1) / kGroup, [&](uint32_t gi) {
        const uint32_t i0 = gi * kGroup, cnt = std::min(kGroup, n - i0);
        float *m = p_res + size_t(i0) * NN;
        for (size_t e = 0; e < size_t(cnt) * NN; ++e) m[e] = a_res * m[e] + b_res[e % NN];
        sinkhorn(m, N, cnt);
    });
}

void mhc_scatter(float a_post, const float *b_post, const float *p_post, const float *R, uint32_t active,
                 const float *y, uint32_t N, uint32_t D, float *X, float *Xs) {
    float hp[64];  // lanes <= 64 (both containers' caps)
    for (uint32_t k = 0; k < N; ++k) {
        const float off = (k == active) ? 0.0f : -4.0f;
        hp[k] = 2.0f * sigmoid(a_post * p_post[k] + b_post[k] + off);
    }
    mhc_mix(R, hp, y, N, D, X, Xs);
}

void lane_mean(const float *X, uint32_t N, uint32_t d, float *mean) {
    for (uint32_t c = 0; c < d; ++c) {
        float sum = 0.0f;
        for (uint32_t k = 0; k < N; ++k) sum += X[size_t(k) * d + c];
        mean[c] = sum / float(N);
    }
}

void lm_head_rows(const CqMatrix &head, uint32_t out_rows, const float *x, size_t x_stride, uint32_t n, float *y,
                  size_t y_floats, float *const *logits) {
    const uint32_t fit = uint32_t(std::min<size_t>(n, y_floats / out_rows));
    if (fit < 2) {
        for (uint32_t i = 0; i < n; ++i) cq_matmul(head, x + i * x_stride, x_stride, 1, 0, out_rows, logits[i], out_rows);
        return;
    }
    for (uint32_t b = 0; b < n; b += fit) {
        const uint32_t m = std::min(fit, n - b);
        cq_matmul(head, x + b * x_stride, x_stride, m, 0, out_rows, y, out_rows);
        for (uint32_t i = 0; i < m; ++i) std::memcpy(logits[b + i], y + size_t(i) * out_rows, sizeof(float) * out_rows);
    }
}

}  // namespace needle
