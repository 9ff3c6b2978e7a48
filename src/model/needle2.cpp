// Needle 2 forward pass (model-v2.md §3), over a chunk of positions (§6).
// Read top to bottom: bind weights, sequence state, workspace, then forward: embed -> engram ->
// layers (router, attention, MLP, lane update) -> LM head.
#include "model/needle2.h"
#include "model/kv_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "core/f16.h"
#include "core/huge_pages.h"
#include "model/model_common.h"

namespace needle {

namespace {

// Engram n-gram hash of table tau at position p (model-v2.md §2.4); hist[q] for q <= p.
uint32_t engram_hash(const uint32_t *hist, uint32_t p, uint32_t tau, uint32_t order, uint32_t slots) {
    uint32_t acc = 0x9E3779B9u * (tau + 1);
    for (uint32_t j = 0; j < order; ++j) {
        const uint32_t tok = (p >= j) ? hist[p - j] : 0u;
        acc = (acc ^ tok) * 0x01000193u;
    }
    acc ^= acc >> 15;
    return acc % slots;
}

// A finite rope_theta > 0 (container rule 9) can still be so small that a RoPE frequency or
// angle overflows float; cos/sin of inf is NaN, which would poison every logit. Checked before
// anything is allocated, with the same float arithmetic as the table in bind().
void check_rope(const Needle2Geometry &g) {
    for (uint32_t i = 0; i < g.hd / 2; ++i) {
        const float inv_freq = 1.0f / std::pow(g.rope_theta, float(2 * i) / float(g.hd));
        if (!std::isfinite(inv_freq) || !std::isfinite(float(g.Tmax - 1) * inv_freq))
            fail(NEEDLE_E_FORMAT, strf("header: rope_theta %g gives a non-finite RoPE angle (head_dim %u, "
                                       "max_seq_len %u)", double(g.rope_theta), g.hd, g.Tmax));
    }
}

}  // namespace

uint32_t needle2_effective_window(const HeaderV2 &h) {
    uint32_t w = h.kv_window;
    if (w == 0) {  // "size it from the KV budget" (architecture.kv_budget_window)
        const uint64_t kv = uint64_t(h.num_kv_heads) * h.head_dim;
        const uint64_t per_pos = uint64_t(h.num_layers) * (2 * kv + 2 * (kv / 32) * 4) +
                                 uint64_t(h.num_engram_sites) * (h.d_model + (h.d_model / 32) * 4);
        const uint64_t budget = per_pos ? (12058624ull / per_pos) / 32 * 32 : h.max_seq_len;
        w = uint32_t(std::max<uint64_t>(160, std::min<uint64_t>(budget, h.max_seq_len)));
    }
    return w >= h.max_seq_len ? 0 : w;
}

// ---------------------------------------------------------------- sequence state (§5)

struct Needle2Model::Seq final : Sequence {
    KvLayout kvl;     // window, sinks (tool-calling.md §10.3) and ring slots (§4.3)
    uint32_t ring;    // = kvl.ring
    uint32_t vring;   // Engram value ring slots: (taps-1)*dil + 1
    uint32_t L, K, hd, D;  // geometry the spans are cut by
    std::vector<uint32_t> hist;  // [Tmax]
    KvType kv_type;
    HugeVector<float> kv;        // f32: [L][2][K][ring][hd], K then V of each layer
    HugeVector<int8_t> kv8;      // int8: the same layout (both read whole every step: 2 MB pages)
    std::vector<float> kv_scale; // int8: [L][2][K][ring], one scale per row
    std::vector<float> vraw;     // [S][vring][D] un-convolved Engram values
    mutable ProbePool pool;      // probe-head pooling (needle2_heads.cpp); empty when off
    void reset() override {
        pos = 0;
        std::fill(hist.begin(), hist.end(), 0u);
        pool.reset();
    }
    void visit_state(uint32_t at, StateVisitor fn, void *ctx) override;

    // First row of the K (v = false) or V ring of layer l, KV head kvh, in rows of hd.
    size_t first_row(const Needle2Geometry &g, uint32_t l, uint32_t kvh, bool v) const {
        return (size_t(l) * 2 * g.K + (v ? g.K : 0) + kvh) * ring;
    }
    // Stores row x[hd] at position p of that ring.
    void store(const Needle2Geometry &g, uint32_t l, uint32_t kvh, bool v, uint32_t p, const float *x) {
        const size_t row = first_row(g, l, kvh, v) + kvl.slot(p);
        if (kv_type == KvType::INT8) quantize_i8(x, g.hd, kv8.data() + row * g.hd, &kv_scale[row]);
        else std::memcpy(kv.data() + row * g.hd, x, sizeof(float) * g.hd);
    }
    template <class T>
    KvRing<T> ring_of(const Needle2Geometry &g, uint32_t l, uint32_t kvh, bool v, const T *base,
                      const float *scales) const {
        const size_t row = first_row(g, l, kvh, v);
        return KvRing<T>{base + row * g.hd, scales ? scales + row : nullptr, g.hd, ring};
    }
};

std::unique_ptr<Sequence> Needle2Model::new_sequence(const SequenceOptions &opt) const {
    const Needle2Geometry &g = g_;
    const int32_t kv_window = opt.kv_window;
    auto s = std::make_unique<Seq>();
    if (kv_window < -1) fail(NEEDLE_E_INVALID_ARGUMENT, strf("kv_window %d is negative", kv_window));
    uint32_t w = kv_window == -1 ? default_window_ : uint32_t(kv_window);
    // Sinks only matter under a window; a window plus sinks covering max_seq_len is full causal.
    s->kvl = KvLayout::make(w, opt.sink_tokens, g.Tmax);
    // max_tokens bounds the ring, full causal or windowed: a state never holds more positions, so
    // with ring = limit <= window + sinks no slot wraps and every query reads keys 0..p, which
    // are exactly its visible ones (kv_layout.h: a key p - j >= window is then a sink).
    s->limit = opt.max_tokens ? std::min(opt.max_tokens, g.Tmax) : g.Tmax;
    s->kvl.ring = std::min(s->kvl.ring, s->limit);
    s->ring = s->kvl.ring;
    s->options = opt;
    s->options.kv_window = int32_t(s->kvl.window);
    s->options.sink_tokens = s->kvl.sinks;
    s->options.max_tokens = s->limit;
    s->options.probe_heads = opt.probe_heads && !heads_.empty();
    if (s->options.probe_heads) init_pool(s->pool);
    s->vring = g.S ? (g.taps - 1) * g.dil + 1 : 0;
    s->L = g.L, s->K = g.K, s->hd = g.hd, s->D = g.D;
    s->hist.assign(g.Tmax, 0u);
    s->kv_type = opt.kv_type;
    const size_t rows = size_t(g.L) * 2 * g.K * s->ring;
    if (opt.kv_type == KvType::INT8) {
        s->kv8.assign(rows * g.hd, 0);
        s->kv_scale.assign(rows, 0.0f);
    } else {
        s->kv.assign(rows * g.hd, 0.0f);
    }
    s->vraw.assign(size_t(g.S) * s->vring * g.D, 0.0f);
    s->arena = ArenaLease(n_threads_);
    return s;
}

// Spans in a fixed order: token history, KV (used: the slots written by `at` positions),
// Engram value ring, pool accumulators.
void Needle2Model::Seq::visit_state(uint32_t at, StateVisitor fn, void *ctx) {
    auto span = [&](void *p, size_t bytes, size_t used) { fn(ctx, StateSpan{static_cast<uint8_t *>(p), bytes, used}); };
    const size_t filled = std::min(at, ring), vfilled = std::min(at, vring);
    span(hist.data(), hist.size() * 4, size_t(at) * 4);
    const size_t nrings = size_t(L) * 2 * K;  // [L][2][K] rings of `ring` rows of hd
    for (size_t r = 0; r < nrings; ++r) {
        if (kv_type == KvType::INT8) {
            span(kv8.data() + r * ring * hd, size_t(ring) * hd, filled * hd);
            span(kv_scale.data() + r * ring, size_t(ring) * 4, filled * 4);
        } else {
            span(kv.data() + r * ring * hd, size_t(ring) * hd * 4, filled * hd * 4);
        }
    }
    for (size_t si = 0; vring && si < vraw.size() / (size_t(vring) * D); ++si)
        span(vraw.data() + si * vring * D, size_t(vring) * D * 4, vfilled * D * 4);
    span(pool.acc.data(), pool.acc.size() * 8, pool.acc.size() * 8);
}

// ---------------------------------------------------------------- workspace (chunk scratch)

// Rows i0 .. i0+n-1 of a workspace hold positions p0 .. p0+n-1 of sequence *s: a prefill chunk
// is one part, a needle_decode_many step one part per sequence (n = 1 each). Row-wise work and
// the matmuls run over all rows at once; what reads a sequence's history (KV ring, Engram ring,
// pooling) runs part by part.
struct Needle2Model::Part {
    Seq *s;
    uint32_t i0, n, p0;
};

struct Needle2Model::Work final : Workspace {
    std::vector<Part> parts;     // [capacity], filled by forward_many
    HugeVector<float> buf;       // every activation of a chunk (2 MB pages when that large)
    std::vector<uint32_t> hash;  // [cap][T] table slots, UINT32_MAX = n-gram not yet valid
    // Per-position strides are the widths below; every pointer is [capacity][width].
    float *X, *Xn, *xh, *f, *fh, *ek, *ev, *vchunk, *a, *b, *rv, *u, *bx, *t, *hAh;
    float *q, *k, *v, *gl, *o, *oh, *att, *y, *mlp, *scores, *hf, *hfh;
    float *rope;  // [capacity][hd]: cos then sin of each position's RoPE angles (§2.1)
};

std::unique_ptr<Workspace> Needle2Model::new_workspace(uint32_t cap) const {
    const Needle2Geometry &g = g_;
    auto w = std::make_unique<Work>();
    w->capacity = cap;
    const size_t nD = g.nD, SD = size_t(g.S) * g.D;
    const size_t widths[] = {nD, nD, g.nD_pad, g.F_pad, g.F_pad, SD, SD, SD, g.n, g.n,
                             size_t(g.n) * g.n, g.D, g.D, g.D, g.D_pad, g.A, g.Kd, g.Kd, g.A,
                             g.A, g.A_pad, g.D, g.D, g.Nh, g.hd};
    float **ptrs[] = {&w->X, &w->Xn, &w->xh, &w->f, &w->fh, &w->ek, &w->ev, &w->vchunk,
                      &w->a, &w->b, &w->rv, &w->u, &w->bx, &w->t, &w->hAh, &w->q, &w->k,
                      &w->v, &w->gl, &w->o, &w->oh, &w->att, &w->y, &w->mlp, &w->rope};
    static_assert(sizeof widths / sizeof widths[0] == sizeof ptrs / sizeof ptrs[0], "buffers");
    size_t total = size_t(g.H) * g.Tmax + g.D + g.D_pad;  // scores per head, hf, hfh (single)
    for (size_t wd : widths) total += wd * cap;
    w->buf.assign(total, 0.0f);
    float *p = w->buf.data();
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; ++i) {
        *ptrs[i] = p;
        p += widths[i] * cap;
    }
    w->scores = p;
    w->hf = p + size_t(g.H) * g.Tmax;
    w->hfh = w->hf + g.D;
    w->hash.assign(size_t(cap) * std::max(1u, g.T), 0u);
    w->parts.resize(cap);
    return w;
}

// ---------------------------------------------------------------- load-time binding

Needle2Model::Needle2Model(std::shared_ptr<const FileBytes> bytes, const ContainerV2 &c, int n_threads, bool fast)
    : bytes_(std::move(bytes)) {
    n_threads_ = n_threads;
    fast_ = fast;
    const HeaderV2 &h = c.header;
    Needle2Geometry &g = g_;
    g.V = h.vocab_size, g.D = h.d_model, g.H = h.num_heads, g.K = h.num_kv_heads;
    g.hd = h.head_dim, g.A = g.H * g.hd, g.Kd = g.K * g.hd, g.L = h.num_layers;
    g.n = h.mhc_lanes, g.Nh = h.hada_n, g.Tmax = h.max_seq_len;
    g.S = h.num_engram_sites, g.T = h.num_engram_tables, g.slots = h.engram_slots;
    g.sub = h.engram_sub_dim, g.F = g.T * g.sub, g.taps = h.engram_conv_taps;
    g.dil = h.engram_conv_dilation, g.num_orders = h.num_engram_orders;
    if (g.S == 0) {
        // Without sites the engram header fields are unchecked (container-v2.md §12.1 rule 7)
        // and meaningless: they must not size anything (T * sub could wrap, or ask for GBs).
        g.T = g.slots = g.sub = g.F = g.taps = 0;
    }
    g.heads_e = g.num_orders ? g.T / g.num_orders : 0;
    for (int i = 0; i < 4; ++i) g.orders[i] = h.engram_orders[i];
    g.G = c.group ? c.group : 128;
    g.D_pad = round_up(g.D, g.G), g.A_pad = round_up(g.A, g.G), g.F_pad = round_up(std::max(g.F, 1u), g.G);
    g.nD = g.n * g.D, g.nD_pad = round_up(g.nD, g.G);
    g.rope_theta = h.rope_theta;
    default_window_ = needle2_effective_window(h);
    check_rope(g);
    // The tokenizer blob is validated before the weights are converted: a damaged blob is
    // refused without allocating the arena.
    if (c.tokenizer) tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::parse(c.tokenizer, c.tokenizer_bytes, g.V));
    bind(c);
    bind_heads(c);
    file_ = bytes_;

    info_.format_version = 2;
    info_.vocab_size = g.V, info_.d_model = g.D, info_.num_layers = g.L;
    info_.num_heads = g.H, info_.num_kv_heads = g.K, info_.head_dim = g.hd, info_.v_head_dim = g.hd;
    info_.max_seq_len = g.Tmax, info_.kv_window = default_window_;
    info_.mhc_lanes = g.n, info_.num_engram_sites = g.S;
    info_.out_vocab = g.V;
    info_.has_confidence_head = probe_head_dim(ProbeHead::Confidence) > 0;
    info_.has_contrastive_head = probe_head_dim(ProbeHead::Contrastive) > 0;
    info_.file_bytes = c.file_bytes;
    for (const TensorRecord &t : c.tensors)
        if (t.dtype != DType::RAW) info_.weight_bytes += t.nbytes;
    if (tokenizer_) {
        info_.bos_id = tokenizer_->bos_id(), info_.eos_id = tokenizer_->eos_id();
        info_.pad_id = tokenizer_->pad_id(), info_.unk_id = tokenizer_->unk_id();
    }
}

void Needle2Model::bind(const ContainerV2 &c) {
    const Needle2Geometry &g = g_;
    const CanonV2 &cn = c.canon;
    const uint32_t last = cn.final_norm();  // probe heads (after final_norm) are not bound here
    size_t need = CqTables::kFloats + g.hd / 2;  // LUTs, RoPE frequencies
    for (uint32_t i = 0; i <= last; ++i) {
        const TensorRecord &t = c.tensors[i];
        need += t.dtype == DType::CQ ? size_t(t.shape[0]) * ((t.shape[1] + t.group - 1) / t.group)
                                     : size_t(elements(t));
    }
    arena_.reset(need);
    Arena &ar = arena_;

    // Level tables per width (cq-kernels.md §8). Ternary levels are indexed by crumb 0/1/2/3.
    const CqTables tables = make_cq_tables(c.codebook, g.G, ar);
    auto cq = [&](uint32_t idx) { return bind_cq(c.tensors[idx], tables, ar); };
    auto fp = [&](uint32_t idx) {
        float *p = ar.take(size_t(elements(c.tensors[idx])));
        to_f32(c.tensors[idx], elements(c.tensors[idx]), p);
        return static_cast<const float *>(p);
    };

    embedding_ = cq(cn.embedding());
    layers_.resize(g.L);
    for (uint32_t l = 0; l < g.L; ++l) {
        const uint32_t b = cn.layer(l);
        Needle2Layer &ly = layers_[l];
        ly.norm_in = fp(b + kNormIn), ly.q = cq(b + kQProj), ly.k = cq(b + kKProj);
        ly.v = cq(b + kVProj), ly.q_norm = fp(b + kQNorm), ly.k_norm = fp(b + kKNorm);
        ly.gate = cq(b + kGateProj), ly.out = cq(b + kOutProj), ly.post_norm = fp(b + kPostNorm);
        ly.attn_gate = fp(b + kAttnGate)[0], ly.pre_hada = fp(b + kPreHada);
        ly.d1 = fp(b + kD1), ly.d2 = fp(b + kD2), ly.d3 = fp(b + kD3);
    }
    const uint32_t m = cn.mhc();
    a_pre_ = fp(m + kAPre), a_post_ = fp(m + kAPost), a_res_ = fp(m + kARes);
    b_pre_ = fp(m + kBPre), b_post_ = fp(m + kBPost), b_res_ = fp(m + kBRes);
    phi_pre_ = cq(m + kPhiPre), phi_post_ = cq(m + kPhiPost), phi_res_ = cq(m + kPhiRes);
    site_of_layer_.assign(g.L, -1);
    sites_.resize(g.S);
    for (uint32_t s = 0; s < g.S; ++s) {
        const uint32_t e = cn.engram(s);
        Needle2EngramSite &st = sites_[s];
        st.layer = c.header.engram_sites[s];
        st.tables = cq(e + kTables), st.key_proj = cq(e + kKeyProj);
        st.value_proj = cq(e + kValueProj), st.taps = fp(e + kTaps);
        site_of_layer_[st.layer] = int32_t(s);
    }
    final_norm_ = fp(cn.final_norm());

    // The matrices cq_matmul reads get the kernels' rows-in-lanes copy (engram tables are only
    // read row by row through cq_dequantize_row, in stored form).
    std::vector<CqMatrix *> mats{&embedding_, &phi_pre_, &phi_post_, &phi_res_};
    for (Needle2Layer &ly : layers_)
        for (CqMatrix *m : {&ly.q, &ly.k, &ly.v, &ly.gate, &ly.out}) mats.push_back(m);
    for (Needle2EngramSite &st : sites_) mats.push_back(&st.key_proj), mats.push_back(&st.value_proj);
    // The embedding's pages stay: cq_dequantize_row reads token rows in stored form.
    block_matmul_weights(mats, fast_, blocked_);

    // RoPE frequencies (§2.1), float32. The cos/sin rows are made per position by rope_rows():
    // a [max_seq_len][head_dim] table cost ~5 M instructions at load and 512 KB for needle2.
    float *inv_freq = ar.take(g.hd / 2);
    for (uint32_t i = 0; i < g.hd / 2; ++i) inv_freq[i] = 1.0f / std::pow(g.rope_theta, float(2 * i) / float(g.hd));
    rope_inv_freq_ = inv_freq;
}

// RoPE angles of positions p0 .. p0+n-1 into rows i0 .. (§2.1): float32 angle, cos and sin evaluated in double.
void Needle2Model::rope_rows(Work &w, uint32_t i0, uint32_t p0, uint32_t n) const {
    const uint32_t half = g_.hd / 2;
    for (uint32_t i = 0; i < n; ++i) {
        float *cs = w.rope + size_t(i0 + i) * g_.hd, *sn = cs + half;
        for (uint32_t k = 0; k < half; ++k) {
            const float angle = float(p0 + i) * rope_inv_freq_[k];
            cs[k] = float(std::cos(double(angle)));
            sn[k] = float(std::sin(double(angle)));
        }
    }
}

// ---------------------------------------------------------------- forward pass

void Needle2Model::forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                           float *logits) const {
    Work &w = static_cast<Work &>(ws);
    const Part part{&static_cast<Seq &>(seq), 0, n, seq.pos};
    run(&part, 1, w, tokens, n);
    if (logits) lm_head(w, n - 1, logits);
}

void Needle2Model::forward_many(Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
                                float *const *logits) const {
    Work &w = static_cast<Work &>(ws);
    for (uint32_t i = 0; i < n; ++i) w.parts[i] = Part{static_cast<Seq *>(seqs[i]), i, 1, seqs[i]->pos};
    run(w.parts.data(), n, w, tokens, n);
    if (logits) lm_head_many(w, n, logits);
}

// Rows 0..R-1 of the workspace through the whole network, tokens[i] at row i (parts: above).
void Needle2Model::run(const Part *parts, uint32_t np, Work &w, const uint32_t *tokens, uint32_t R) const {
    for (const Part *p = parts; p != parts + np; ++p) {
        std::copy(tokens + p->i0, tokens + p->i0 + p->n, p->s->hist.begin() + p->p0);  // step 1 (§6)
        rope_rows(w, p->i0, p->p0, p->n);
    }
    embed(w, tokens, R);
    engram(parts, np, w, R);
    // Probe-head cells (§7.1): cell l (e0, then the lanes after layer l - 1) is pooled inside
    // layer l, beside its q/k/v/gate matmuls; the last cell after the last layer.
    for (uint32_t l = 0; l < g_.L; ++l) layer(parts, np, w, l, R, tokens);
    pool_chunk(parts, np, w, g_.L, tokens);
    for (const Part *p = parts; p != parts + np; ++p) p->s->pos = p->p0 + p->n;
}

// Pools probe-head cell c (§7.2) of every part's rows from the lanes w.X, the cells built in
// w.Xn: free from the router's prepared input (layer, 5.1) to the lanes' snapshot (block_tail).
void Needle2Model::pool_chunk(const Part *parts, uint32_t np, Work &w, uint32_t c, const uint32_t *tokens) const {
    for (const Part *p = parts; p != parts + np; ++p)
        if (!p->s->pool.acc.empty())
            pool_cells(p->s->pool, c, w.X + size_t(p->i0) * g_.nD, tokens + p->i0, p->n, w.Xn + size_t(p->i0) * g_.nD);
}

void Needle2Model::probe_head_output(const Sequence &seq, ProbeHead h, float *out) const {
    head_output(static_cast<const Seq &>(seq).pool, h, out);
}

// Step 2 + 4: e0 = deq_row(embedding, t) * sqrt(D), copied into every lane.
void Needle2Model::embed(Work &w, const uint32_t *tokens, uint32_t n) const {
    const Needle2Geometry &g = g_;
    const float scale = std::sqrt(float(g.D));
    for_positions(n, [&](uint32_t i) {
        float *X = w.X + size_t(i) * g.nD;
        cq_dequantize_row(embedding_, tokens[i], X);
        for (uint32_t c = 0; c < g.D; ++c) X[c] *= scale;
        for (uint32_t lane = 1; lane < g.n; ++lane) std::memcpy(X + lane * g.D, X, sizeof(float) * g.D);
    });
}

// Step 3: Engram keys and convolved values of every site, once per position.
void Needle2Model::engram(const Part *parts, uint32_t np, Work &w, uint32_t n) const {
    const Needle2Geometry &g = g_;
    if (g.S == 0) return;
    for (const Part *pt = parts; pt != parts + np; ++pt)
        for (uint32_t i = 0; i < pt->n; ++i) {  // hashes are shared by all sites
            const uint32_t p = pt->p0 + i;
            for (uint32_t tau = 0; tau < g.T; ++tau) {
                const uint32_t order = g.orders[tau / g.heads_e];
                w.hash[size_t(pt->i0 + i) * g.T + tau] = (p + 1 >= order)
                    ? engram_hash(pt->s->hist.data(), p, tau, order, g.slots) : UINT32_MAX;
            }
        }
    const size_t SD = size_t(g.S) * g.D;
    for (uint32_t si = 0; si < g.S; ++si) {
        const Needle2EngramSite &st = sites_[si];
        for_positions(n, [&](uint32_t i) {
            float *f = w.f + size_t(i) * g.F_pad;
            for (uint32_t tau = 0; tau < g.T; ++tau) {
                const uint32_t slot = w.hash[size_t(i) * g.T + tau];
                float *dst = f + size_t(tau) * g.sub;
                if (slot == UINT32_MAX) std::fill(dst, dst + g.sub, 0.0f);
                else cq_dequantize_row(st.tables, tau * g.slots + slot, dst);
            }
            cq_prepare_input(f, g.F, g.F_pad, g.G, w.fh + size_t(i) * g.F_pad);
        });
        float *ek = w.ek + size_t(si) * g.D, *vc = w.vchunk + size_t(si) * g.D;
        const CqProduct kv[] = {{&st.key_proj, 0, g.D, ek, SD}, {&st.value_proj, 0, g.D, vc, SD}};
        cq_matmul_many(kv, 2, w.fh, g.F_pad, n);
        // Tap convolution over un-convolved values at p - j*dil: from this chunk when q >= p0,
        // else from the ring; the ring is written only afterwards (§6).
        for (const Part *pt = parts; pt != parts + np; ++pt) {
            Seq &s = *pt->s;
            float *ring = s.vraw.data() + size_t(si) * s.vring * g.D;
            const float *vp = vc + size_t(pt->i0) * SD;
            for (uint32_t i = 0; i < pt->n; ++i)
                engram_conv_at(pt->p0 + i, pt->p0, g.taps, g.dil, 0, st.taps, vp, SD, ring, s.vring, g.D,
                               w.ev + (pt->i0 + i) * SD + size_t(si) * g.D);
            engram_ring_store(pt->p0, pt->n, vp, SD, ring, s.vring, g.D);
        }
    }
}

// Step 5: one layer over the chunk.
void Needle2Model::layer(const Part *parts, uint32_t np, Work &w, uint32_t l, uint32_t n,
                         const uint32_t *tokens) const {
    const Needle2Geometry &g = g_;
    const Needle2Layer &ly = layers_[l];
    const uint32_t N = g.n, D = g.D;
    const int32_t site = site_of_layer_[l];

    // 5.1 router input x̂ = rms_unit over all lanes, rotated once for the three phi bands.
    for_positions(n, [&](uint32_t i) {
        float *Xn = w.Xn + size_t(i) * g.nD;
        rms_unit(w.X + size_t(i) * g.nD, g.nD, Xn);
        cq_prepare_input(Xn, g.nD, g.nD_pad, g.G, w.xh + size_t(i) * g.nD_pad);
    });
    const CqProduct phi[] = {{&phi_pre_, l * N, N, w.a, N}, {&phi_post_, l * N, N, w.b, N},
                             {&phi_res_, l * N * N, N * N, w.rv, size_t(N) * N}};
    cq_matmul_many(phi, 3, w.xh, g.nD_pad, n);

    for_positions(n, [&](uint32_t i) {
        const float *X = w.X + size_t(i) * g.nD;
        float *u = w.u + size_t(i) * D, *bx = w.bx + size_t(i) * D, *t = w.t + size_t(i) * D;
        // 5.2-5.3 pre-routing and block input u = sum_i hpre_i X_i
        std::fill(u, u + D, 0.0f);
        for (uint32_t k = 0; k < N; ++k) {
            const float off = (k == l % N) ? 4.0f : -4.0f;
            const float hpre = sigmoid(a_pre_[l] * w.a[i * N + k] + b_pre_[l * N + k] + off);
            for (uint32_t c = 0; c < D; ++c) u[c] += hpre * X[size_t(k) * D + c];
        }
        // 5.4 Engram gate on rms_unit(u) . rms_unit(ek)
        std::memcpy(bx, u, sizeof(float) * D);
        if (site >= 0) {
            const size_t off = size_t(i) * g.S * D + size_t(site) * D;
            rms_unit(u, D, t);
            float *rk = w.y + size_t(i) * D;  // free until block_tail: holds rms_unit(ek)
            rms_unit(w.ek + off, D, rk);
            float dot = 0.0f;
            for (uint32_t c = 0; c < D; ++c) dot += t[c] * rk[c];
            const float alpha = sigmoid(dot / std::sqrt(float(D)));
            for (uint32_t c = 0; c < D; ++c) bx[c] += alpha * w.ev[off + c];
        }
        // 5.5 attention input hA, shared by q/k/v/gate
        zcrms(bx, ly.norm_in, D, t);
        cq_prepare_input(t, D, g.D_pad, g.G, w.hAh + size_t(i) * g.D_pad);
    });
    const CqProduct qkvg[] = {{&ly.q, 0, g.A, w.q, g.A}, {&ly.k, 0, g.Kd, w.k, g.Kd},
                              {&ly.v, 0, g.Kd, w.v, g.Kd}, {&ly.gate, 0, g.A, w.gl, g.A}};
    // Two jobs that need nothing of q/k/v/gate run inside its region (the other thread takes more
    // of its rows meanwhile) instead of alone on the calling thread: 5.8's Sinkhorn (of phi's output; read by block_tail) and the
    // pooling of probe cell l (the lanes, unchanged until block_tail). In a decode step (Sapphire
    // Rapids VM, 2 threads) each was ~6 % of the calling thread's time while the other waited.
    // (Not phi's post and res bands: a cq_matmul_many inside another doubles the stack in use,
    // ~96 KB a frame, for ~2 % of prefill.)
    auto side_jobs = [&] {
        mhc_routing(a_res_[l], b_res_ + size_t(l) * N * N, N, n, w.rv);  // w.rv: p_res -> R
        pool_chunk(parts, np, w, l, tokens);
    };
    const FunctionRef<void()> side(side_jobs);  // borrows the lambda above
    cq_matmul_many(qkvg, 4, w.hAh, g.D_pad, n, &side);
    if (np == 1) attention(*parts->s, w, l, parts->p0, parts->n, parts->i0);
    else attention_many(parts, np, w, l);  // forward_many: one position per part
    cq_matmul(ly.out, w.oh, g.A_pad, n, 0, D, w.att, D);
    for_positions(n, [&](uint32_t i) { block_tail(w, l, i); });
}

// 5.5 before attention, row i: q/k norms and RoPE in place (the cache write is kv_store).
void Needle2Model::qk_rope(Work &w, uint32_t l, uint32_t i) const {
    const Needle2Geometry &g = g_;
    const Needle2Layer &ly = layers_[l];
    const float *cs = w.rope + size_t(i) * g.hd, *sn = cs + g.hd / 2;
    float *q = w.q + size_t(i) * g.A, *k = w.k + size_t(i) * g.Kd;
    for (uint32_t r = 0; r < g.H; ++r) {
        zcrms(q + r * g.hd, ly.q_norm, g.hd, q + r * g.hd);
        rope(q + r * g.hd, g.hd, cs, sn);
    }
    for (uint32_t kv = 0; kv < g.K; ++kv) {
        zcrms(k + kv * g.hd, ly.k_norm, g.hd, k + kv * g.hd);
        rope(k + kv * g.hd, g.hd, cs, sn);
    }
}

// Row i's K and V of group kv written to the cache of s at position p.
void Needle2Model::kv_store(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i, uint32_t kv) const {
    const Needle2Geometry &g = g_;
    s.store(g, l, kv, false, p, w.k + size_t(i) * g.Kd + kv * g.hd);
    s.store(g, l, kv, true, p, w.v + size_t(i) * g.Kd + kv * g.hd);
}

// Both, every group (a needle_decode_many row).
void Needle2Model::qk_store(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i) const {
    qk_rope(w, l, i);
    for (uint32_t kv = 0; kv < g_.K; ++kv) kv_store(s, w, l, p, i, kv);
}

// Attention of the query heads of KV group kv (heads kv * H/K ..) for row i at position p of
// s, in one kernel call that reads the group's keys once (each head: own scores row, own
// output slice, the bits it gets alone).
void Needle2Model::attend(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i, uint32_t kv) const {
    const Needle2Geometry &g = g_;
    const uint32_t G = g.H / g.K, r = kv * G, lo = s.kvl.lo(p);  // visible keys: kv_layout.h
    const float *q = w.q + size_t(i) * g.A + r * g.hd;
    float *o = w.o + size_t(i) * g.A + r * g.hd, *scores = w.scores + size_t(r) * g.Tmax;
    if (s.kv_type == KvType::INT8)
        attention_rows(q, g.hd, G, s.ring_of(g, l, kv, false, s.kv8.data(), s.kv_scale.data()),
                       s.ring_of(g, l, kv, true, s.kv8.data(), s.kv_scale.data()), lo, p, scores, g.Tmax, o, g.hd);
    else
        attention_rows(q, g.hd, G, s.ring_of<float>(g, l, kv, false, s.kv.data(), nullptr),
                       s.ring_of<float>(g, l, kv, true, s.kv.data(), nullptr), lo, p, scores, g.Tmax, o, g.hd);
}

// Output gate of row i and the prepared input of out_proj.
void Needle2Model::gate_out(Work &w, uint32_t i) const {
    const Needle2Geometry &g = g_;
    float *o = w.o + size_t(i) * g.A;
    const float *gl = w.gl + size_t(i) * g.A;
    sigmoid_gate(o, gl, g.A);
    cq_prepare_input(o, g.A, g.A_pad, g.G, w.oh + size_t(i) * g.A_pad);
}

// KV groups are independent (own scores, own output): split over the arena's threads once the keys
// are many enough to pay for it (needle2 at 64+ keys: >= 2^16 multiply-adds).
constexpr uint64_t kParallelAttention = uint64_t(1) << 16;

// 5.5 q/k norms, RoPE, cache write and attention of positions p0..p0+n-1 of s (workspace rows
// i0..). Within a KV group, strictly in position order: with a ring of `window` slots, writing
// p+1 before attending p would overwrite a key p still sees (§6). The groups' rings are
// disjoint, so one task per group walks the chunk (store p, attend p, store p+1, ...): one
// fork/join per layer, not one per position (a 512-token prefill had 13,824), and each group
// owns its heads' scores rows. The bits of the position-by-position order.
void Needle2Model::attention(Seq &s, Work &w, uint32_t l, uint32_t p0, uint32_t n, uint32_t i0) const {
    const Needle2Geometry &g = g_;
    for_positions(n, [&](uint32_t j) { qk_rope(w, l, i0 + j); });
    uint64_t macs = 0;
    for (uint32_t j = 0; j < n; ++j) macs += uint64_t(g.H) * (p0 + j - s.kvl.lo(p0 + j) + 1) * (2 * g.hd);
    auto groups = [&](uint32_t b, uint32_t e) {
        for (uint32_t kv = b; kv != e; ++kv)
            for (uint32_t j = 0; j < n; ++j) {
                kv_store(s, w, l, p0 + j, i0 + j, kv);
                attend(s, w, l, p0 + j, i0 + j, kv);
            }
    };
    if (macs >= kParallelAttention) parallel_for(0, g.K, 1, groups);
    else groups(0, g.K);
    for_positions(n, [&](uint32_t j) { gate_out(w, i0 + j); });
}

// 5.5 for a needle_decode_many step: parts of one position each, of distinct sequences, so no
// cache write is read by another row: every row's K/V is stored first, then all KV groups of
// all rows run in one parallel region (one fork/join per layer, not one per sequence; group kv
// reuses the scores rows of its heads), then the gates. Per row the bits of attention().
void Needle2Model::attention_many(const Part *parts, uint32_t np, Work &w, uint32_t l) const {
    const Needle2Geometry &g = g_;
    uint64_t macs = 0;
    for (const Part *pt = parts; pt != parts + np; ++pt) {
        qk_store(*pt->s, w, l, pt->p0, pt->i0);
        macs += uint64_t(g.H) * (pt->p0 - pt->s->kvl.lo(pt->p0) + 1) * (2 * g.hd);
    }
    auto groups = [&](uint32_t b, uint32_t e) {
        for (const Part *pt = parts; pt != parts + np; ++pt)
            for (uint32_t kv = b; kv != e; ++kv) attend(*pt->s, w, l, pt->p0, pt->i0, kv);
    };
    if (macs >= kParallelAttention) parallel_for(0, g.K, 1, groups);
    else groups(0, g.K);
    for (const Part *pt = parts; pt != parts + np; ++pt) gate_out(w, pt->i0);
}

// 5.5 (residual) to 5.9 for position i of the chunk.
void Needle2Model::block_tail(Work &w, uint32_t l, uint32_t i) const {
    const Needle2Geometry &g = g_;
    const Needle2Layer &ly = layers_[l];
    const uint32_t N = g.n, D = g.D;
    float *bx = w.bx + size_t(i) * D, *t = w.t + size_t(i) * D, *y = w.y + size_t(i) * D;
    const float *u = w.u + size_t(i) * D;
    // x1 = bx + σ(attn_gate) * zcrms(att; post_norm)  (x1 overwrites bx)
    zcrms(w.att + size_t(i) * D, ly.post_norm, D, t);
    const float ag = sigmoid(ly.attn_gate);
    for (uint32_t c = 0; c < D; ++c) bx[c] += ag * t[c];
    // 5.6 x2 = x1 + hmlp(zcrms(x1; pre_hada)); y = x2 - u
    float *z = w.mlp + size_t(i) * g.Nh;
    zcrms(bx, ly.pre_hada, D, z);
    std::fill(z + D, z + g.Nh, 0.0f);
    for (uint32_t c = 0; c < g.Nh; ++c) z[c] *= ly.d1[c];
    fwht(z, g.Nh);
    for (uint32_t c = 0; c < g.Nh; ++c) z[c] *= ly.d2[c];
    silu(z, g.Nh, z);
    fwht(z, g.Nh);
    for (uint32_t c = 0; c < D; ++c) y[c] = (bx[c] + ly.d3[c] * z[c]) - u[c];
    // 5.7 post-routing, 5.8 residual mixing, 5.9 lane update from a snapshot of the lanes
    mhc_scatter(a_post_[l], b_post_ + l * N, w.b + i * N, w.rv + size_t(i) * N * N, l % N, y, N, D,
                w.X + size_t(i) * g.nD, w.Xn + size_t(i) * g.nD);
}

// Step 6 input of row i: the prepared zcrms(mean of lanes; final_norm) into hfh[D_pad].
void Needle2Model::lm_input(Work &w, uint32_t i, float *hfh) const {
    const Needle2Geometry &g = g_;
    lane_mean(w.X + size_t(i) * g.nD, g.n, g.D, w.hf);
    zcrms(w.hf, final_norm_, g.D, w.hf);
    cq_prepare_input(w.hf, g.D, g.D_pad, g.G, hfh);
}

// Step 6: tied LM head of row i.
void Needle2Model::lm_head(Work &w, uint32_t i, float *logits) const {
    lm_input(w, i, w.hfh);
    cq_matmul(embedding_, w.hfh, g_.D_pad, 1, 0, g_.V, logits, g_.V);
}

// Step 6 of rows 0..n-1 into logits[i]: the inputs go to w.hAh (free after the last layer), the
// products to the scratch before it (free too).
void Needle2Model::lm_head_many(Work &w, uint32_t n, float *const *logits) const {
    const Needle2Geometry &g = g_;
    for (uint32_t i = 0; i < n; ++i) lm_input(w, i, w.hAh + size_t(i) * g.D_pad);
    lm_head_rows(embedding_, g.V, w.hAh, g.D_pad, n, w.buf.data(), size_t(w.hAh - w.buf.data()), logits);
}

}  // namespace needle
