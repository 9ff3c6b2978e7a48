// Needle 2 probe heads (model-v2.md §7, container-v2.md §8): binding, the online pooling of the
// cells while positions are fed (no stored cells, no second pass) and the head outputs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/f16.h"
#include "core/parallel.h"
#include "model/needle2.h"


namespace needle {

namespace {

// Pool accumulators are (L+1) * P * (D+2) doubles per state: a file may not ask for more.
constexpr uint64_t kMaxPoolDoubles = uint64_t(1) << 25;  // 256 MB

void record_to_f32(const TensorRecord &t, size_t n, float *out) {
    if (t.dtype == DType::F32) std::memcpy(out, t.data, n * 4);
    else f16_to_f32_n(t.data, n, out);
}

}  // namespace

void ProbePool::reset() {
    for (size_t i = 0; i < acc.size(); i += 2 + D) {
        acc[i] = -std::numeric_limits<double>::infinity();
        std::fill(acc.begin() + i + 1, acc.begin() + i + 2 + D, 0.0);
    }
}

void Needle2Model::bind_heads(const ContainerV2 &c) {
    const Needle2Geometry &g = g_;
    size_t need = 0;
    uint64_t probes = 0;
    for (const ProbeHeadRecords &r : c.heads) {
        const TensorRecord &pr = c.tensors[r.probes], &pj = c.tensors[r.proj];
        probes += pr.shape[0];
        need += size_t(pr.shape[0]) * g.D + pj.shape[0];
    }
    if (probes * (g.L + 1) * (uint64_t(g.D) + 2) > kMaxPoolDoubles)
        fail(NEEDLE_E_FORMAT, strf("probe heads: %llu probes over %u cells of d_model %u exceed this build's "
                                   "pooling limit", (unsigned long long)probes, g.L + 1, g.D));
    head_arena_.resize(need);
    float *p = head_arena_.data();
    for (const ProbeHeadRecords &r : c.heads) {
        const TensorRecord &pr = c.tensors[r.probes], &pj = c.tensors[r.proj], &bs = c.tensors[r.bias];
        Needle2Head h;
        h.kind = r.kind == ProbeHeadKind::Contrastive ? ProbeHead::Contrastive : ProbeHead::Confidence;
        h.P = pr.shape[0], h.out = pj.shape[0], h.first = head_probes_;
        const size_t np = size_t(h.P) * g.D;
        record_to_f32(pr, np, p), h.probes = p, p += np;
        h.proj = pj.data, h.proj_f16 = pj.dtype != DType::F32;
        record_to_f32(bs, h.out, p), h.bias = p, p += h.out;
        h.stored[0] = {pr.data, size_t(pr.nbytes)}, h.stored[1] = {pj.data, size_t(pj.nbytes)};
        h.stored[2] = {bs.data, size_t(bs.nbytes)};
        head_probes_ += h.P;
        heads_.push_back(h);
    }
}

void Needle2Model::init_pool(ProbePool &pool) const {
    if (heads_.empty()) return;
    pool.cells = g_.L + 1, pool.probes = head_probes_, pool.D = g_.D;
    pool.acc.assign(size_t(pool.cells) * pool.probes * (2 + g_.D), 0.0);
    pool.pooled.assign(g_.D, 0.0);
    uint32_t out = 0;
    for (const Needle2Head &h : heads_) out = std::max(out, h.out);
    pool.out.assign(out, 0.0);
    pool.reset();
}

void Needle2Model::pool_cells(ProbePool &pool, uint32_t c, const float *X, const uint32_t *tokens, uint32_t n,
                              float *scratch) const {
    const Needle2Geometry &g = g_;
    const uint32_t D = g.D;
    // The cells of the chunk: e0 (lane 0 right after the embedding) or the mean of the lanes.
    for (uint32_t i = 0; i < n; ++i) {
        const float *x = X + size_t(i) * g.nD;
        float *cell = scratch + size_t(i) * D;
        if (c == 0) {
            std::memcpy(cell, x, sizeof(float) * D);
            continue;
        }
        // Lane by lane (contiguous, so vectorised), each cell[d] summed in lane order from 0.
        std::fill(cell, cell + D, 0.0f);
        for (uint32_t k = 0; k < g.n; ++k)
            for (uint32_t d = 0; d < D; ++d) cell[d] += x[size_t(k) * D + d];
        for (uint32_t d = 0; d < D; ++d) cell[d] /= float(g.n);
    }
    const double inv_sqrt_d = 1.0 / std::sqrt(double(D));
    // One probe's running softmax over the chunk's cells, in position order (§7.2, double).
    auto probe = [&](uint32_t kp) {
        const Needle2Head *h = &heads_[0];
        for (const Needle2Head &hh : heads_)
            if (kp >= hh.first) h = &hh;
        const float *q = h->probes + size_t(kp - h->first) * D;
        pool_probe(q, scratch, D, tokens, n, D, inv_sqrt_d, pool.at(c, kp));
    };
    // Probes are independent: split them over the arena's threads when the work pays for it.
    if (uint64_t(n) * head_probes_ * D >= (uint64_t(1) << 15))
        parallel_for(0, head_probes_, 1, [&](uint32_t b, uint32_t e) {
            for (uint32_t k = b; k < e; ++k) probe(k);
        });
    else
        for (uint32_t k = 0; k < head_probes_; ++k) probe(k);
}

std::vector<Model::ByteSpan> Needle2Model::probe_head_tensors(ProbeHead kind) const {
    for (const Needle2Head &h : heads_)
        if (h.kind == kind) return {h.stored[0], h.stored[1], h.stored[2]};
    return {};
}

uint32_t Needle2Model::probe_head_dim(ProbeHead kind) const {
    for (const Needle2Head &h : heads_)
        if (h.kind == kind) return h.out;
    return 0;
}

// §7.2 merge of the per-cell-index softmaxes, then §7.3 out = proj · pooled + bias (double).
void Needle2Model::head_output(ProbePool &pool, ProbeHead kind, float *out) const {
    const Needle2Head *h = nullptr;
    for (const Needle2Head &hh : heads_)
        if (hh.kind == kind) h = &hh;
    if (!h || pool.acc.empty())
        fail(NEEDLE_E_UNSUPPORTED,
             h ? "this state does not pool the probe heads (created with needle_state_params.probe_heads 0)"
               : (kind == ProbeHead::Confidence ? "this model has no confidence head" : "this model has no contrastive head"));
    const uint32_t D = g_.D;
    std::vector<double> &pooled = pool.pooled;
    // out accumulates probe by probe: out[o] = bias[o] + Σ_k Σ_d proj[o][k*D + d] * pooled_k[d].
    std::vector<double> &res = pool.out;
    std::fill(res.begin(), res.begin() + h->out, 0.0);
    for (uint32_t k = 0; k < h->P; ++k) {
        const uint32_t kp = h->first + k;
        double m = -std::numeric_limits<double>::infinity();
        for (uint32_t c = 0; c < pool.cells; ++c) m = std::max(m, pool.at(c, kp)[0]);
        if (m == -std::numeric_limits<double>::infinity())
            fail(NEEDLE_E_INVALID_ARGUMENT, "no position has been pooled yet (feed at least one non-PAD token)");
        double s = 0.0;
        std::fill(pooled.begin(), pooled.end(), 0.0);
        for (uint32_t c = 0; c < pool.cells; ++c) {
            const double *a = pool.at(c, kp);
            if (a[1] == 0.0) continue;
            const double r = std::exp(a[0] - m);
            s += r * a[1];
            for (uint32_t d = 0; d < D; ++d) pooled[d] += r * a[2 + d];
        }
        for (uint32_t o = 0; o < h->out; ++o) {
            const size_t first = size_t(o) * h->P * D + size_t(k) * D;  // element index in proj
            double dot = 0.0;
            if (h->proj_f16) {
                const uint8_t *w = h->proj + 2 * first;
                for (uint32_t d = 0; d < D; ++d)
                    dot += double(f16_to_f32(uint16_t(w[2 * d] | (w[2 * d + 1] << 8)))) * pooled[d];
            } else {
                const uint8_t *w = h->proj + 4 * first;
                for (uint32_t d = 0; d < D; ++d) {
                    float x;
                    std::memcpy(&x, w + 4 * d, 4);
                    dot += double(x) * pooled[d];
                }
            }
            res[o] += dot / s;
        }
    }
    for (uint32_t o = 0; o < h->out; ++o) out[o] = float(res[o] + double(h->bias[o]));
}

}  // namespace needle
