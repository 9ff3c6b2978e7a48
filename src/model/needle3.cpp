// Needle 3 forward pass (model-v3.md §1-§4) over a chunk of positions; a decode step is a
// chunk of one. Read top to bottom: binding (with the depth ladder), sequence state, workspace,
// then forward: embed -> Engram -> layers (mHC mix-down, Engram gate, attention with the Q/K/V
// conv, HadaMlp, mHC scatter-up) -> LM head. Positions of a chunk run in parallel except where a
// history is read (conv tails, KV ring, Engram tail, confidence pooling): there strictly in
// position order, so any chunking gives the bits of one position at a time.
#include "model/needle3.h"
#include "model/needle3_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/f16.h"


namespace needle {

namespace {


// Engram hash of table (oi, h) at position p over the id history (model-v3.md §1.2).
uint32_t engram_hash3(const uint32_t *hist, uint32_t p, uint32_t seed, uint32_t order, uint32_t slots) {
    uint32_t acc = 0x9E3779B9u * seed;
    for (uint32_t j = 0; j < order; ++j) acc = (acc ^ (p >= j ? hist[p - j] : 0u)) * 0x01000193u;
    acc ^= acc >> 15;
    return acc % slots;
}

// fq of model-v3.md §4: int8 codes of x[m] and their scale (1 for an all-zero x).
float quantize_fq(const float *x, uint32_t m, int8_t *code) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < m; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / scale;
    for (uint32_t i = 0; i < m; ++i) {
        const float r = std::round(x[i] * inv);  // half away from zero; NaN -> 0 below
        code[i] = r >= 127.0f ? int8_t(127) : r <= -128.0f ? int8_t(-128) : r == r ? int8_t(r) : int8_t(0);
    }
    return scale;
}

void fake_quantize(float *x, uint32_t m) {
    int8_t code[1u << 16];
    const float scale = quantize_fq(x, m, code);
    for (uint32_t i = 0; i < m; ++i) x[i] = float(code[i]) * scale;
}

// acc[0..w) = sum over i < n of a[i * a_stride] * z[i * z_stride + 0..w), i ascending from 0.0f:
// per element the sum order of the plain loop `dst[j] += a * z[j]` over i (the same bits), with
// the accumulators in registers (kW lanes at a time) instead of a store and reload per term.
constexpr uint32_t kKronW = 16;
inline void kron_dot(const float *a, size_t a_stride, const float *z, size_t z_stride, uint32_t n, uint32_t w,
                     float *out) {
    if (w == kKronW) {
        float acc[kKronW] = {};
        for (uint32_t i = 0; i < n; ++i) {
            const float ai = a[i * a_stride];
            const float *zi = z + i * z_stride;
            for (uint32_t j = 0; j < kKronW; ++j) acc[j] += ai * zi[j];
        }
        std::memcpy(out, acc, sizeof acc);
        return;
    }
    std::fill(out, out + w, 0.0f);
    for (uint32_t i = 0; i < n; ++i)
        for (uint32_t j = 0; j < w; ++j) out[j] += a[i * a_stride] * z[i * z_stride + j];
}

// out = A^T Z B with Z = in as [ba][bb], A [ba][ba], B [bb][bb] (model-v3.md §2.1); t1 scratch.
// t1[k][j] = sum_i A[i][k] Z[i][j] (i ascending), out[k][l] = sum_j t1[k][j] B[j][l] (j ascending).
void kron(const float *in, const float *A, const float *B, uint32_t ba, uint32_t bb, float *t1, float *out) {
    for (uint32_t k = 0; k < ba; ++k)
        for (uint32_t j0 = 0; j0 < bb; j0 += kKronW)
            kron_dot(A + k, ba, in + j0, bb, ba, std::min(kKronW, bb - j0), t1 + size_t(k) * bb + j0);
    for (uint32_t k = 0; k < ba; ++k)
        for (uint32_t l0 = 0; l0 < bb; l0 += kKronW)
            kron_dot(t1 + size_t(k) * bb, 1, B + l0, bb, bb, std::min(kKronW, bb - l0), out + size_t(k) * bb + l0);
}

// Products W_j x for matrices sharing the input x[n][cols]: one prepared input per distinct
// group, then one parallel region per group (the bits of one cq_matmul per product).
void matmul_shared(const CqProduct *prods, uint32_t np, const float *x, size_t x_stride, uint32_t cols,
                   uint32_t n, float *xh, size_t xh_stride, const FunctionRef<void()> *side = nullptr) {
    bool done[8] = {};
    for (uint32_t a = 0; a < np; ++a) {
        if (done[a]) continue;
        const CqMatrix &m = *prods[a].w;
        for_positions(n, [&](uint32_t i) {
            cq_prepare_input(x + i * x_stride, cols, m.cols_pad, m.group, xh + i * xh_stride);
        });
        CqProduct same[8];
        uint32_t k = 0;
        for (uint32_t b = a; b < np; ++b)
            if (!done[b] && prods[b].w->group == m.group) same[k++] = prods[b], done[b] = true;
        cq_matmul_many(same, k, xh, xh_stride, n, side);
        side = nullptr;  // run once, with the first region
    }
}

}  // namespace

std::vector<uint32_t> ladder_order(uint32_t L) {
    std::vector<uint32_t> order{0};
    if (L > 1) order.push_back(L - 1);
    while (order.size() < L) {
        std::vector<uint32_t> s = order;
        std::sort(s.begin(), s.end());
        uint32_t best = 0, ga = 0;
        for (size_t i = 0; i + 1 < s.size(); ++i)
            if (s[i + 1] - s[i] > 1 && s[i + 1] - s[i] > best) best = s[i + 1] - s[i], ga = s[i];
        order.push_back(ga + best / 2);  // floor((a + b) / 2) with b = a + best
    }
    return order;
}

// ---------------------------------------------------------------- sequence state (§3)


std::unique_ptr<Sequence> Needle3Model::new_sequence(const SequenceOptions &opt) const {
    const Needle3Geometry &g = g_;
    if (opt.kv_window != -1 && opt.kv_window != 0 && uint32_t(opt.kv_window) != g.W)
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("kv_window %d: a Needle 3 model attends through its own window "
                                             "(sliding_window %u); use -1", opt.kv_window, g.W));
    if (opt.kv_window == 0 && g.W != 0)
        fail(NEEDLE_E_INVALID_ARGUMENT, "kv_window 0: Needle 3 local layers cannot attend fully causally; use -1");
    auto s = std::make_unique<Seq>();
    s->limit = opt.max_tokens == 0 ? g.Tmax : std::min(opt.max_tokens, g.Tmax);
    s->options = opt;
    s->options.kv_window = int32_t(g.W);
    // KV sinks (tool-calling.md §10.3) apply to the local layers: their ring holds the first
    // sink_tokens keys for good plus the last W (kv_layout.h); global layers see every key anyway.
    const KvLayout local = KvLayout::make(g.W, opt.sink_tokens, g.Tmax), global = KvLayout::make(0, 0, g.Tmax);
    s->options.sink_tokens = local.sinks;
    s->options.max_tokens = s->limit;
    s->options.probe_heads = opt.probe_heads && has_conf_;
    s->kv_type = opt.kv_type;
    const uint32_t L = uint32_t(layers_.size());
    s->slots.resize(L), s->kvl.resize(L), s->kv_off.resize(L), s->sc_off.resize(L);
    size_t kv = 0, sc = 0;
    for (uint32_t l = 0; l < L; ++l) {
        s->kvl[l] = layers_[l].global || g.W == 0 ? global : local;
        // Fewer slots than the ring only when max_tokens is below it: then no position reaches
        // the ring's end, so slot(p) = p and lo(p) = 0 (kv_layout.h) hold as for the full ring.
        s->slots[l] = std::min(s->kvl[l].ring, s->limit);
        s->kv_off[l] = kv, s->sc_off[l] = sc;
        kv += size_t(g.G) * s->slots[l] * (g.dq + g.dv);
        sc += size_t(2) * g.G * s->slots[l];
    }
    if (opt.kv_type == KvType::INT8) {
        s->kv8.assign(kv, 0);
        s->kv_scale.assign(sc, 1.0f);
    } else {
        s->kv.assign(kv, 0.0f);
    }
    s->tail.assign(size_t(L) * (g.T ? g.T - 1 : 0) * (g.qd + g.kd + g.vd), 0.0f);
    s->hist.assign(s->limit, 0u);
    s->vring = g.Te ? (g.Te - 1) * g.dil + 1 : 1;
    s->eraw.assign(size_t(g.S) * s->vring * g.d, 0.0f);
    if (s->options.probe_heads) {
        s->pool.assign(size_t(conf_.cells) * conf_.k * (g.d + 2), 0.0f);
        s->conf_scratch.assign(size_t(conf_.cells) * conf_.k * g.d + size_t(conf_.cells) * conf_.k +
                                   2 * size_t(conf_.Q) * g.d + kPrepAlign + round_up(conf_.Q * g.d, kPrepAlign), 0.0f);
    }
    s->G = g.G, s->dq = g.dq, s->dv = g.dv, s->D = g.d;
    s->arena = ArenaLease(n_threads_);
    return s;
}

// Spans in a fixed order (state_io.h): id history; per layer, K then V rings of each KV head
// (int8: codes, then the K and V scales of the layer); the Q/K/V conv tails and the Engram value
// rings; the confidence pooling. `used` is what position `at` reads: the first min(at, slots)
// ring rows (slot p % slots), the first min(at, vring) Engram rows, the whole conv tail (its
// valid rows are the last ones) and the whole pool.
void Needle3Model::Seq::visit_state(uint32_t at, StateVisitor fn, void *ctx) {
    auto span = [&](void *p, size_t bytes, size_t used) {
        fn(ctx, StateSpan{static_cast<uint8_t *>(p), bytes, std::min(used, bytes)});
    };
    span(hist.data(), hist.size() * 4, size_t(at) * 4);
    const bool i8 = kv_type == KvType::INT8;
    for (size_t l = 0; l < slots.size(); ++l) {
        const size_t ns = slots[l], filled = std::min<size_t>(at, ns), esz = i8 ? 1 : 4;
        uint8_t *base = i8 ? reinterpret_cast<uint8_t *>(kv8.data() + kv_off[l])
                           : reinterpret_cast<uint8_t *>(kv.data() + kv_off[l]);
        for (uint32_t part = 0; part < 2; ++part) {  // K rings [G][ns][dq], then V rings [G][ns][dv]
            const size_t dim = part ? dv : dq;
            for (uint32_t h = 0; h < G; ++h, base += ns * dim * esz) span(base, ns * dim * esz, filled * dim * esz);
        }
        if (i8)
            for (uint32_t r = 0; r < 2 * G; ++r)  // K scales [G][ns], then V scales [G][ns]
                span(kv_scale.data() + sc_off[l] + r * ns, ns * 4, filled * 4);
    }
    span(tail.data(), tail.size() * 4, tail.size() * 4);
    const size_t vfilled = std::min(at, vring), rows = size_t(vring) * D;  // eraw: [S][vring][D]
    for (size_t off = 0; off + rows <= eraw.size() && rows; off += rows) span(eraw.data() + off, rows * 4, vfilled * D * 4);
    span(pool.data(), pool.size() * 4, pool.size() * 4);
}

// ---------------------------------------------------------------- workspace


std::unique_ptr<Workspace> Needle3Model::new_workspace(uint32_t cap) const {
    const Needle3Geometry &g = g_;
    auto w = std::make_unique<Work>();
    w->capacity = cap;
    w->pnd = round_up(g.nd, kPrepAlign), w->pd = round_up(g.d, kPrepAlign), w->pod = round_up(g.od, kPrepAlign);
    w->max_rank = 1;
    for (const Needle3Layer &ly : layers_) w->max_rank = std::max(w->max_rank, ly.rank);
    const size_t SD = size_t(g.S) * g.d;
    const size_t widths[] = {g.nd, g.nd, w->pnd, g.n, g.n, size_t(g.n) * g.n, g.d, g.d, g.d, w->pd,
                             g.qd, g.kd, g.vd, g.od, g.qd, g.kd, g.vd, g.od, w->pod,
                             g.d, g.d, g.hn, g.hn, g.hn, g.hn, w->max_rank, g.d, g.d, w->pd, SD, SD, SD,
                             g.d, g.dq};
    float **ptrs[] = {&w->X, &w->Xs, &w->xh, &w->pa, &w->pb, &w->pr, &w->u, &w->bx, &w->t, &w->hh,
                      &w->q, &w->k, &w->v, &w->gl, &w->qc, &w->kc, &w->vc, &w->o, &w->oh,
                      &w->att, &w->y, &w->z, &w->t1, &w->t2, &w->cv, &w->rb, &w->mlp, &w->f, &w->fh,
                      &w->ek, &w->ev, &w->er, &w->cell, &w->rope};
    static_assert(sizeof widths / sizeof widths[0] == sizeof ptrs / sizeof ptrs[0], "buffers");
    // Scores per head: a ring never exceeds max_seq_len (a local layer with KV sinks holds W + sinks).
    const uint32_t max_slots = std::max(1u, g.Tmax);
    size_t total = size_t(g.H) * max_slots + g.d + w->pd;
    for (size_t wd : widths) total += wd * cap;
    w->buf.assign(total, 0.0f);
    float *p = w->buf.data();
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; ++i) {
        *ptrs[i] = p;
        p += widths[i] * cap;
    }
    w->scores = p;
    w->hf = p + size_t(g.H) * max_slots;
    w->hfh = w->hf + g.d;
    w->hash.assign(size_t(cap) * std::max(1u, g.n_tables), 0u);
    w->parts.resize(cap);
    return w;
}

// ---------------------------------------------------------------- load-time binding

Needle3Model::Needle3Model(std::shared_ptr<const FileBytes> bytes, const ContainerV3 &c, int n_threads,
                           uint32_t depth, bool fast)
    : bytes_(std::move(bytes)) {
    n_threads_ = n_threads;
    fast_ = fast;
    const HeaderV3 &h = c.header;
    const uint32_t L = h.num_layers;
    if (depth != 0 && (depth < 2 || depth > L))
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("depth %u: this model runs 0 (all layers) or 2..%u", depth, L));
    const std::vector<uint32_t> order = ladder_order(L);
    kept_.assign(order.begin(), order.begin() + (depth ? depth : L));
    std::sort(kept_.begin(), kept_.end());

    Needle3Geometry &g = g_;
    g.V = h.vocab_size, g.OV = h.out_vocab ? h.out_vocab : h.vocab_size, g.d = h.d_model;
    g.H = h.num_heads, g.G = h.num_kv_heads, g.dq = h.qk_head_dim, g.dv = h.v_head_dim;
    g.L = uint32_t(kept_.size()), g.n = h.mhc_lanes, g.hn = h.hada_n, g.ba = c.ba, g.bb = c.bb;
    g.Tmax = h.max_seq_len, g.W = h.sliding_window, g.T = h.qkv_conv_taps;
    g.qd = g.H * g.dq, g.kd = g.G * g.dq, g.vd = g.G * g.dv, g.od = g.H * g.dv, g.nd = g.n * g.d;
    g.slots = h.engram_slots, g.sub = h.engram_sub_dim, g.n_tables = h.num_engram_tables;
    g.n_orders = h.n_orders, g.heads_e = g.n_tables / g.n_orders;
    g.max_order = 0;
    for (uint32_t i = 0; i < 4; ++i) g.orders[i] = i < g.n_orders ? h.orders[i] : 0;
    for (uint32_t i = 0; i < g.n_orders; ++i) g.max_order = std::max(g.max_order, g.orders[i]);
    g.Te = h.engram_conv_taps, g.dil = h.engram_conv_dilation;
    g.seed_stride = h.engram_seed_heads ? h.engram_seed_heads : g.heads_e;
    g.rope_theta = h.rope_theta;
    // The tokenizer blob is validated before the weights are converted.
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::parse(c.tokenizer, c.tokenizer_bytes, g.V));
    bind(c, depth);

    info_.format_version = 3;
    info_.vocab_size = g.V, info_.d_model = g.d, info_.num_layers = g.L;
    info_.num_heads = g.H, info_.num_kv_heads = g.G, info_.head_dim = g.dq, info_.v_head_dim = g.dv;
    info_.max_seq_len = g.Tmax, info_.kv_window = g.W;
    info_.mhc_lanes = g.n, info_.num_engram_sites = g.S;
    info_.file_bytes = c.file_bytes;
    for (const TensorRecord &t : c.tensors)
        if (t.dtype != DType::RAW) info_.weight_bytes += t.nbytes;
    info_.out_vocab = g.OV, info_.qkv_conv_taps = g.T;
    for (uint32_t l = 0; l < g.L; ++l)
        if (layers_[l].global) info_.global_layer_mask |= uint64_t(1) << l;
    info_.has_confidence_head = has_conf_;
    for (const ProbeHeadV3 &hd : c.heads) info_.has_contrastive_head |= hd.code == 1;
    info_.bos_id = tokenizer_->bos_id(), info_.eos_id = tokenizer_->eos_id();
    info_.pad_id = tokenizer_->pad_id(), info_.unk_id = tokenizer_->unk_id();
}

void Needle3Model::bind(const ContainerV3 &c, uint32_t depth) {
    (void)depth;
    Needle3Geometry &g = g_;
    const CanonV3 &cn = c.canon;
    const HeaderV3 &h = c.header;
    size_t need = CqTables::kFloats + g.dq / 2 + 2 * size_t(g.hn);
    for (const TensorRecord &t : c.tensors) {
        if (t.dtype == DType::CQ) need += cq_norm_floats(t) + ((t.bits & 0xffu) == 5 ? CqTables::kTernaryFloats : 0);
        else if (t.dtype != DType::RAW) need += size_t(float_count(t));
    }
    if (c.confidence >= 0) {  // dequantised probes and queries
        const uint32_t b = c.heads[size_t(c.confidence)].first;
        need += (size_t(c.tensors[b].shape[0]) + c.tensors[b + 2].shape[0]) * g.d;
    }
    arena_.reset(need);
    Arena &ar = arena_;
    CqTables tables = make_cq_tables(c.codebook, 128, ar);
    auto cq = [&](uint32_t idx) {
        const TensorRecord &t = c.tensors[idx];
        if ((t.bits & 0xffu) == 5) set_ternary_group(tables, t.group, ar);  // levels scale with the group
        return bind_cq(t, tables, ar);
    };
    auto fp = [&](uint32_t idx) {
        const TensorRecord &t = c.tensors[idx];
        float *p = ar.take(size_t(float_count(t)));
        to_f32(t, float_count(t), p);
        return static_cast<const float *>(p);
    };

    embedding_ = cq(cn.embedding());
    std::vector<int32_t> site_of(h.num_layers, -1);
    for (uint32_t s = 0; s < h.n_sites; ++s) site_of[h.sites[s]] = int32_t(s);
    layers_.resize(g.L);
    std::vector<uint32_t> kept_sites;
    for (uint32_t li = 0; li < g.L; ++li) {
        const uint32_t l = kept_[li];
        Needle3Layer &ly = layers_[li];
        auto at = [&](uint32_t slot) { return cn.at(l, slot); };
        ly.src = l;
        ly.global = g.W == 0 || ((h.global_mask >> l) & 1u);
        ly.site = -1;
        if (site_of[l] >= 0) {
            ly.site = int32_t(kept_sites.size());
            kept_sites.push_back(uint32_t(site_of[l]));
        }
        ly.rank = c.cond_rank[l];
        ly.norm_in = fp(at(kV3NormIn));
        ly.q = cq(at(kV3Q)), ly.k = cq(at(kV3K)), ly.v = cq(at(kV3V));
        ly.qtaps = ly.ktaps = ly.vtaps = nullptr;
        if (g.T) ly.qtaps = fp(at(kV3QTaps)), ly.ktaps = fp(at(kV3KTaps)), ly.vtaps = fp(at(kV3VTaps));
        ly.q_norm = fp(at(kV3QNorm)), ly.k_norm = fp(at(kV3KNorm));
        ly.gate = cq(at(kV3Gate)), ly.out = cq(at(kV3Out));
        ly.post_norm = fp(at(kV3PostNorm)), ly.attn_gate = fp(at(kV3AttnGate))[0], ly.pre_hada = fp(at(kV3PreHada));
        ly.d1 = fp(at(kV3D1)), ly.d2 = fp(at(kV3D2)), ly.b2 = fp(at(kV3B2)), ly.d3 = fp(at(kV3D3));
        ly.d4 = fp(at(kV3D4)), ly.w1a = fp(at(kV3W1a)), ly.w1b = fp(at(kV3W1b)), ly.w2a = fp(at(kV3W2a));
        ly.w2b = fp(at(kV3W2b)), ly.w3a = fp(at(kV3W3a)), ly.w3b = fp(at(kV3W3b));
        ly.cond_v = fp(at(kV3CondV)), ly.cond_u = fp(at(kV3CondU));
    }
    const uint32_t m = cn.mhc();
    a_pre_ = fp(m), a_post_ = fp(m + 1), a_res_ = fp(m + 2);
    b_pre_ = fp(m + 3), b_post_ = fp(m + 4), b_res_ = fp(m + 5);
    phi_pre_ = cq(m + 6), phi_post_ = cq(m + 7), phi_res_ = cq(m + 8);
    const float *p1 = fp(cn.perm()), *p2 = fp(cn.perm() + 1);
    p1_.resize(g.hn), p2_.resize(g.hn);
    for (uint32_t i = 0; i < g.hn; ++i) p1_[i] = uint32_t(p1[i]), p2_[i] = uint32_t(p2[i]);
    g.S = uint32_t(kept_sites.size());
    sites_.resize(g.S);
    for (uint32_t s = 0; s < g.S; ++s) {
        const uint32_t e = cn.engram(kept_sites[s]);
        sites_[s].tables = cq(e), sites_[s].key_proj = cq(e + 1), sites_[s].value_proj = cq(e + 2);
        sites_[s].taps = fp(e + 3);
    }
    final_norm_ = fp(cn.final_norm());
    if (c.confidence >= 0) bind_confidence(c, c.heads[size_t(c.confidence)].first, ar, tables);

    // The matrices cq_matmul reads get the kernels' rows-in-lanes copy, as in Needle 2. Engram
    // tables are read row by row (cq_dequantize_row) and the tied embedding too: both stay in
    // stored form. The confidence projection (one row, once per query) stays as stored.
    std::vector<CqMatrix *> mats{&embedding_, &phi_pre_, &phi_post_, &phi_res_};
    for (Needle3Layer &ly : layers_)
        for (CqMatrix *m : {&ly.q, &ly.k, &ly.v, &ly.gate, &ly.out}) mats.push_back(m);
    for (Needle3Site &st : sites_) mats.push_back(&st.key_proj), mats.push_back(&st.value_proj);
    block_matmul_weights(mats, fast_, blocked_);

    float *inv_freq = ar.take(g.dq / 2);
    for (uint32_t i = 0; i < g.dq / 2; ++i) inv_freq[i] = 1.0f / std::pow(g.rope_theta, float(2 * i) / float(g.dq));
    rope_inv_freq_ = inv_freq;
}

// ---------------------------------------------------------------- forward pass

void Needle3Model::forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                           float *logits) const {
    Work &w = static_cast<Work &>(ws);
    const Part part{&static_cast<Seq &>(seq), 0, n, seq.pos};
    run(&part, 1, w, tokens, n);
    if (logits) lm_head(w, n - 1, logits);
}

void Needle3Model::forward_many(Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
                                float *const *logits) const {
    Work &w = static_cast<Work &>(ws);
    for (uint32_t i = 0; i < n; ++i) w.parts[i] = Part{static_cast<Seq *>(seqs[i]), i, 1, seqs[i]->pos};
    run(w.parts.data(), n, w, tokens, n);
    if (logits) lm_head_many(w, n, logits);
}

// Rows 0..R-1 of the workspace through the whole network, tokens[i] at row i (Part: the rows of
// one sequence, needle3_state.h).
void Needle3Model::run(const Part *parts, uint32_t np, Work &w, const uint32_t *tokens, uint32_t R) const {
    const uint32_t half = g_.dq / 2;
    for (const Part *pt = parts; pt != parts + np; ++pt) {
        std::copy(tokens + pt->i0, tokens + pt->i0 + pt->n, pt->s->hist.begin() + pt->p0);
        for (uint32_t i = 0; i < pt->n; ++i)  // RoPE angles (float) of each position, cos/sin in double
            for (uint32_t k = 0; k < half; ++k) {
                const float a = float(pt->p0 + i) * rope_inv_freq_[k];
                w.rope[size_t(pt->i0 + i) * g_.dq + k] = float(std::cos(double(a)));
                w.rope[size_t(pt->i0 + i) * g_.dq + half + k] = float(std::sin(double(a)));
            }
    }
    embed(w, tokens, R);
    for (const Part *pt = parts; pt != parts + np; ++pt) pool_cells(*pt, w, 0);
    engram(parts, np, w, R);
    for (uint32_t li = 0; li < g_.L; ++li) layer(parts, np, w, li, R);
    for (const Part *pt = parts; pt != parts + np; ++pt) pt->s->pos = pt->p0 + pt->n;
}

// §1.1: e = dequant_row(E, x) * sqrt(d) in every lane; it is also confidence cell 0.
void Needle3Model::embed(Work &w, const uint32_t *tokens, uint32_t n) const {
    const Needle3Geometry &g = g_;
    const float scale = std::sqrt(float(g.d));
    for_positions(n, [&](uint32_t i) {
        float *X = w.X + size_t(i) * g.nd;
        cq_dequantize_row(embedding_, tokens[i], X);
        for (uint32_t c = 0; c < g.d; ++c) X[c] *= scale;
        for (uint32_t lane = 1; lane < g.n; ++lane) std::memcpy(X + lane * g.d, X, sizeof(float) * g.d);
        std::memcpy(w.cell + size_t(i) * g.d, X, sizeof(float) * g.d);
    });
}

// §1.2 / §3 Engram keys and convolved values of every kept site.
void Needle3Model::engram(const Part *parts, uint32_t np, Work &w, uint32_t n) const {
    const Needle3Geometry &g = g_;
    if (g.S == 0) return;
    for (const Part *pt = parts; pt != parts + np; ++pt)
        for (uint32_t i = 0; i < pt->n; ++i) {
            const uint32_t p = pt->p0 + i;
            for (uint32_t oi = 0; oi < g.n_orders; ++oi)
                for (uint32_t hh = 0; hh < g.heads_e; ++hh) {
                    const uint32_t tau = oi * g.heads_e + hh, o = g.orders[oi];
                    w.hash[size_t(pt->i0 + i) * g.n_tables + tau] = p + 1 >= o
                        ? engram_hash3(pt->s->hist.data(), p, oi * g.seed_stride + hh + 1, o, g.slots) : UINT32_MAX;
                }
        }
    const size_t SD = size_t(g.S) * g.d;
    for (uint32_t si = 0; si < g.S; ++si) {
        const Needle3Site &st = sites_[si];
        for_positions(n, [&](uint32_t i) {
            float *f = w.f + size_t(i) * g.d;
            for (uint32_t tau = 0; tau < g.n_tables; ++tau) {
                const uint32_t slot = w.hash[size_t(i) * g.n_tables + tau];
                float *dst = f + size_t(tau) * g.sub;
                if (slot == UINT32_MAX) std::fill(dst, dst + g.sub, 0.0f);
                else cq_dequantize_row(st.tables, tau * g.slots + slot, dst);
            }
        });
        float *ek = w.ek + size_t(si) * g.d, *er = w.er + size_t(si) * g.d;
        const CqProduct kv[] = {{&st.key_proj, 0, g.d, ek, SD}, {&st.value_proj, 0, g.d, er, SD}};
        matmul_shared(kv, 2, w.f, g.d, g.d, n, w.fh, w.pd);
        for (const Part *pt = parts; pt != parts + np; ++pt) {
            Seq &s = *pt->s;
            float *ring = s.eraw.data() + size_t(si) * s.vring * g.d;
            const float *ep = er + size_t(pt->i0) * SD;
            for_positions(pt->n, [&](uint32_t i) {
                engram_conv_at(pt->p0 + i, pt->p0, g.Te, g.dil, g.max_order, st.taps, ep, SD, ring, s.vring, g.d,
                               w.ev + (pt->i0 + i) * SD + size_t(si) * g.d);
            });
            engram_ring_store(pt->p0, pt->n, ep, SD, ring, s.vring, g.d);
        }
    }
}

// §1.3: one layer over the chunk.
void Needle3Model::layer(const Part *parts, uint32_t np, Work &w, uint32_t li, uint32_t n) const {
    const Needle3Geometry &g = g_;
    const Needle3Layer &ly = layers_[li];
    const uint32_t N = g.n, D = g.d, l = ly.src;

    // mHC mix-down inputs: unit(lanes) through this layer's Phi rows.
    for_positions(n, [&](uint32_t i) { rms_unit(w.X + size_t(i) * g.nd, g.nd, w.Xs + size_t(i) * g.nd); });
    const CqProduct phi[] = {{&phi_pre_, l * N, N, w.pa, N}, {&phi_post_, l * N, N, w.pb, N},
                             {&phi_res_, l * N * N, N * N, w.pr, size_t(N) * N}};
    matmul_shared(phi, 3, w.Xs, g.nd, g.nd, n, w.xh, w.pnd);

    for_positions(n, [&](uint32_t i) {
        const float *X = w.X + size_t(i) * g.nd;
        float *u = w.u + size_t(i) * D, *bx = w.bx + size_t(i) * D, *t = w.t + size_t(i) * D;
        std::fill(u, u + D, 0.0f);
        for (uint32_t k = 0; k < N; ++k) {
            const float off = (k == li % N) ? 4.0f : -4.0f;
            const float gk = sigmoid(a_pre_[l] * w.pa[i * N + k] + b_pre_[l * N + k] + off);
            for (uint32_t c = 0; c < D; ++c) u[c] += gk * X[size_t(k) * D + c];
        }
        std::memcpy(bx, u, sizeof(float) * D);
        if (ly.site >= 0) {  // Engram gate on the cosine of u and k^E
            const size_t off = size_t(i) * g.S * D + size_t(ly.site) * D;
            float *rk = w.y + size_t(i) * D;  // free until block_tail
            rms_unit(u, D, t);
            rms_unit(w.ek + off, D, rk);
            float dot = 0.0f;
            for (uint32_t c = 0; c < D; ++c) dot += t[c] * rk[c];
            const float alpha = sigmoid(dot / std::sqrt(float(D)));
            for (uint32_t c = 0; c < D; ++c) bx[c] += alpha * w.ev[off + c];
        }
        zcrms(bx, ly.norm_in, D, t);
    });
    const CqProduct qkvg[] = {{&ly.q, 0, g.qd, w.q, g.qd}, {&ly.k, 0, g.kd, w.k, g.kd},
                              {&ly.v, 0, g.vd, w.v, g.vd}, {&ly.gate, 0, g.od, w.gl, g.od}};
    // The Sinkhorn needs only Phi's output and is read only by block_tail: it runs inside the
    // q/k/v/gate region (needle2.cpp layer says why).
    auto sinkhorn_job = [&] { mhc_routing(a_res_[l], b_res_ + size_t(l) * N * N, N, n, w.pr); };
    const FunctionRef<void()> routing(sinkhorn_job);  // borrows the lambda above
    matmul_shared(qkvg, 4, w.t, D, D, n, w.hh, w.pd, &routing);  // w.pr: p_res -> R
    for (const Part *pt = parts; pt != parts + np; ++pt) qkv_conv(*pt, w, li);
    if (np == 1) attention(*parts, w, li);
    else attention_many(parts, np, w, li);  // forward_many: one position per part
    const CqProduct out[] = {{&ly.out, 0, D, w.att, D}};
    matmul_shared(out, 1, w.o, g.od, g.od, n, w.oh, w.pod);
    for_positions(n, [&](uint32_t i) { block_tail(w, li, i); });
    for (const Part *pt = parts; pt != parts + np; ++pt) pool_cells(*pt, w, li + 1);
}

// §1.3 step 3: causal depthwise conv of q, k, v over positions, the previous chunk's last T-1
// pre-conv rows coming from the tail; then the tail moves on.
void Needle3Model::qkv_conv(const Part &pa, Work &w, uint32_t li) const {
    const Needle3Geometry &g = g_;
    const Needle3Layer &ly = layers_[li];
    Seq &s = *pa.s;
    const uint32_t T = g.T, p0 = pa.p0, n = pa.n, i0 = pa.i0, row = g.qd + g.kd + g.vd;
    if (T == 0) {
        std::memcpy(w.qc + size_t(i0) * g.qd, w.q + size_t(i0) * g.qd, sizeof(float) * n * g.qd);
        std::memcpy(w.kc + size_t(i0) * g.kd, w.k + size_t(i0) * g.kd, sizeof(float) * n * g.kd);
        std::memcpy(w.vc + size_t(i0) * g.vd, w.v + size_t(i0) * g.vd, sizeof(float) * n * g.vd);
        return;
    }
    float *tail = s.tail.data() + size_t(li) * (T - 1) * row;
    struct Part { const float *raw, *taps; float *outp; uint32_t dim, off; };  // shadows Needle3Model::Part
    // Rows i0.. of the workspace are this sequence's positions p0..
    const Part parts[3] = {{w.q + size_t(i0) * g.qd, ly.qtaps, w.qc + size_t(i0) * g.qd, g.qd, 0},
                           {w.k + size_t(i0) * g.kd, ly.ktaps, w.kc + size_t(i0) * g.kd, g.kd, g.qd},
                           {w.v + size_t(i0) * g.vd, ly.vtaps, w.vc + size_t(i0) * g.vd, g.vd, g.qd + g.kd}};
    for_positions(n, [&](uint32_t i) {
        const uint32_t p = p0 + i;
        for (const Part &pt : parts) {
            float *o = pt.outp + size_t(i) * pt.dim;
            const float *r0 = pt.raw + size_t(i) * pt.dim;
            for (uint32_t c = 0; c < pt.dim; ++c) o[c] = pt.taps[c] * r0[c];
            for (uint32_t j = 1; j < T && j <= p; ++j) {
                const float *src = j <= i ? pt.raw + size_t(i - j) * pt.dim
                                          : tail + size_t(T - 1 - (j - i)) * row + pt.off;
                const float *tap = pt.taps + size_t(j) * pt.dim;
                for (uint32_t c = 0; c < pt.dim; ++c) o[c] += tap[c] * src[c];
            }
        }
    });
    for (uint32_t x = 0; x + 1 < T; ++x) {  // ascending: reads index x + n before it is rewritten
        const uint32_t m = T - 1 - x;
        float *dst = tail + size_t(x) * row;
        if (m <= n) {
            for (const Part &pt : parts)
                std::memcpy(dst + pt.off, pt.raw + size_t(n - m) * pt.dim, sizeof(float) * pt.dim);
        } else {
            std::memmove(dst, tail + size_t(x + n) * row, sizeof(float) * row);
        }
    }
}

// The KV rings of layer li of s: f32 (kf, vf) or int8 codes and scales (k8, v8, ks, vs).
struct Needle3Model::Rings {
    uint32_t slots;
    float *kf, *vf, *ks, *vs;
    int8_t *k8, *v8;
    Rings(Seq &s, const Needle3Geometry &g, uint32_t li) : slots(s.slots[li]) {
        const bool i8 = s.kv_type == KvType::INT8;
        kf = i8 ? nullptr : s.kv.data() + s.kv_off[li], vf = kf ? kf + size_t(g.G) * slots * g.dq : nullptr;
        k8 = i8 ? s.kv8.data() + s.kv_off[li] : nullptr, v8 = k8 ? k8 + size_t(g.G) * slots * g.dq : nullptr;
        ks = i8 ? s.kv_scale.data() + s.sc_off[li] : nullptr, vs = ks ? ks + size_t(g.G) * slots : nullptr;
    }
};

// §1.3 steps 4-5 of row i (of a sequence of s's KV type): q/k norms and RoPE in place, and
// with the int8 cache the fake quantisation of q. The cache write is kv_store.
void Needle3Model::qk_rope(const Seq &s, Work &w, uint32_t li, uint32_t i) const {
    const Needle3Geometry &g = g_;
    const Needle3Layer &ly = layers_[li];
    const bool i8 = s.kv_type == KvType::INT8;
    const uint32_t half = g.dq / 2;
    const float *cs = w.rope + size_t(i) * g.dq, *sn = cs + half;
    float *q = w.qc + size_t(i) * g.qd, *k = w.kc + size_t(i) * g.kd;
    for (uint32_t r = 0; r < g.H; ++r) {
        zcrms(q + r * g.dq, ly.q_norm, g.dq, q + r * g.dq);
        rope(q + r * g.dq, g.dq, cs, sn);
        if (i8) fake_quantize(q + r * g.dq, g.dq);
    }
    for (uint32_t kv = 0; kv < g.G; ++kv) {
        zcrms(k + kv * g.dq, ly.k_norm, g.dq, k + kv * g.dq);
        rope(k + kv * g.dq, g.dq, cs, sn);
    }
}

// §1.3 step 6 for group kv: row i's K and V into s's cache at position p (int8: quantised on
// write).
void Needle3Model::kv_store(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i, uint32_t kv) const {
    const Needle3Geometry &g = g_;
    const Rings rg(s, g, li);
    const float *kh = w.kc + size_t(i) * g.kd + kv * g.dq, *vh = w.vc + size_t(i) * g.vd + kv * g.dv;
    const size_t kr = size_t(kv) * rg.slots + s.kvl[li].slot(p);
    if (rg.k8) {
        rg.ks[kr] = quantize_fq(kh, g.dq, rg.k8 + kr * g.dq);
        rg.vs[kr] = quantize_fq(vh, g.dv, rg.v8 + kr * g.dv);
    } else {
        std::memcpy(rg.kf + kr * g.dq, kh, sizeof(float) * g.dq);
        std::memcpy(rg.vf + kr * g.dv, vh, sizeof(float) * g.dv);
    }
}

// Both, every group (a needle_decode_many row).
void Needle3Model::qk_store(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i) const {
    qk_rope(s, w, li, i);
    for (uint32_t kv = 0; kv < g_.G; ++kv) kv_store(s, w, li, p, i, kv);
}

// §1.3 step 7, the query heads of KV group kv (heads kv * H/G ..) of row i at position p of s
// (keys lo..p through slot j % slots) in one kernel call that reads the group's keys once;
// head r's scratch row is scores + r * s_stride.
void Needle3Model::attend(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i, uint32_t kv, float *scores,
                          size_t s_stride) const {
    const Needle3Geometry &g = g_;
    const Rings rg(s, g, li);
    const uint32_t lo = s.kvl[li].lo(p), slots = rg.slots, per = g.H / g.G, r = kv * per;
    const size_t kr = size_t(kv) * slots;
    const float *q = w.qc + size_t(i) * g.qd + r * g.dq;
    float *o = w.o + size_t(i) * g.od + r * g.dv, *sc = scores + r * s_stride;
    if (rg.k8)
        attention_rows(q, g.dq, per, KvRing<int8_t>{rg.k8 + kr * g.dq, rg.ks + kr, g.dq, slots},
                       KvRing<int8_t>{rg.v8 + kr * g.dv, rg.vs + kr, g.dv, slots}, lo, p, sc, s_stride, o, g.dv);
    else
        attention_rows(q, g.dq, per, KvRing<float>{rg.kf + kr * g.dq, nullptr, g.dq, slots},
                       KvRing<float>{rg.vf + kr * g.dv, nullptr, g.dv, slots}, lo, p, sc, s_stride, o, g.dv);
}

void Needle3Model::gate_out(Work &w, uint32_t i) const {
    float *o = w.o + size_t(i) * g_.od;
    const float *gl = w.gl + size_t(i) * g_.od;
    sigmoid_gate(o, gl, g_.od);
}

// KV groups split over the arena's threads once the keys are many enough to pay for it.
constexpr uint64_t kParallelAttention3 = uint64_t(1) << 16;

// §1.3 steps 4-7 of the part's positions. Within a KV group strictly in position order (a ring
// slot is rewritten only after its last reader); the groups' rings are disjoint, so one task
// per group walks the chunk (store p, attend p, store p + 1, ...): one fork/join per layer, not
// one per position, each group owning its heads' scores rows. The position-by-position bits.
void Needle3Model::attention(const Part &pa, Work &w, uint32_t li) const {
    Seq &s = *pa.s;
    const Needle3Geometry &g = g_;
    const uint32_t slots = s.slots[li];
    for_positions(pa.n, [&](uint32_t j) { qk_rope(s, w, li, pa.i0 + j); });
    uint64_t macs = 0;
    for (uint32_t j = 0; j < pa.n; ++j)
        macs += uint64_t(g.H) * (pa.p0 + j - s.kvl[li].lo(pa.p0 + j) + 1) * (g.dq + g.dv);
    auto groups = [&](uint32_t b, uint32_t e) {
        for (uint32_t kv = b; kv < e; ++kv)
            for (uint32_t j = 0; j < pa.n; ++j) {
                kv_store(s, w, li, pa.p0 + j, pa.i0 + j, kv);
                attend(s, w, li, pa.p0 + j, pa.i0 + j, kv, w.scores, slots);
            }
    };
    if (macs >= kParallelAttention3) parallel_for(0, g.G, 1, groups);
    else groups(0, g.G);
    for_positions(pa.n, [&](uint32_t j) { gate_out(w, pa.i0 + j); });
}

// §1.3 steps 4-7 for a needle_decode_many step (one position per part, distinct sequences, so
// no row reads another's cache write): all K/V stored first, then every KV group of every row in one
// parallel region per layer; head r's scores row has the stride of max_seq_len (the states'
// rings may differ in size). Per row the bits of attention().
void Needle3Model::attention_many(const Part *parts, uint32_t np, Work &w, uint32_t li) const {
    const Needle3Geometry &g = g_;
    uint64_t macs = 0;
    for (const Part *pt = parts; pt != parts + np; ++pt) {
        qk_store(*pt->s, w, li, pt->p0, pt->i0);
        macs += uint64_t(g.H) * (pt->p0 - pt->s->kvl[li].lo(pt->p0) + 1) * (g.dq + g.dv);
    }
    const size_t stride = std::max(1u, g.Tmax);
    auto groups = [&](uint32_t b, uint32_t e) {
        for (const Part *pt = parts; pt != parts + np; ++pt)
            for (uint32_t kv = b; kv < e; ++kv) attend(*pt->s, w, li, pt->p0, pt->i0, kv, w.scores, stride);
    };
    if (macs >= kParallelAttention3) parallel_for(0, g.G, 1, groups);
    else groups(0, g.G);
    for (const Part *pt = parts; pt != parts + np; ++pt) gate_out(w, pt->i0);
}

// §1.3 from the attention residual to the mHC scatter-up, for position i of the chunk.
void Needle3Model::block_tail(Work &w, uint32_t li, uint32_t i) const {
    const Needle3Geometry &g = g_;
    const Needle3Layer &ly = layers_[li];
    const uint32_t N = g.n, D = g.d, l = ly.src, hn = g.hn;
    float *bx = w.bx + size_t(i) * D, *t = w.t + size_t(i) * D, *y = w.y + size_t(i) * D;
    const float *u = w.u + size_t(i) * D;
    zcrms(w.att + size_t(i) * D, ly.post_norm, D, t);
    const float ag = sigmoid(ly.attn_gate);
    for (uint32_t c = 0; c < D; ++c) bx[c] += ag * t[c];
    // HadaMlp on x = zc(b; pre_hada)
    float *z = w.z + size_t(i) * hn, *t1 = w.t1 + size_t(i) * hn, *t2 = w.t2 + size_t(i) * hn;
    float *cv = w.cv + size_t(i) * hn, *rb = w.rb + size_t(i) * w.max_rank;
    zcrms(bx, ly.pre_hada, D, t);
    const uint32_t r = ly.rank;
    std::fill(rb, rb + r, 0.0f);
    for (uint32_t c = 0; c < D; ++c) {
        const float xc = t[c];
        const float *row = ly.cond_v + size_t(c) * r;
        for (uint32_t j = 0; j < r; ++j) rb[j] += xc * row[j];
    }
    float mx = -INFINITY, sum = 0.0f;
    for (uint32_t j = 0; j < r; ++j) mx = std::max(mx, rb[j]);
    for (uint32_t j = 0; j < r; ++j) sum += (rb[j] = std::exp(rb[j] - mx));
    for (uint32_t j = 0; j < r; ++j) rb[j] /= sum;
    std::fill(cv, cv + hn, 0.0f);
    for (uint32_t j = 0; j < r; ++j) {
        const float pj = rb[j];
        const float *row = ly.cond_u + size_t(j) * hn;
        for (uint32_t k = 0; k < hn; ++k) cv[k] += pj * row[k];
    }
    for (uint32_t k = 0; k < hn; ++k) cv[k] += 1.0f;
    for (uint32_t c = 0; c < hn; ++c) z[c] = c < D ? t[c] * ly.d1[c] : 0.0f;
    kron(z, ly.w1a, ly.w1b, g.ba, g.bb, t1, t2);
    for (uint32_t c = 0; c < hn; ++c) z[c] = t2[p1_[c]];
    for (uint32_t c = 0; c < hn; ++c) z[c] = ly.d2[c] * cv[c] * z[c] + ly.b2[c];
    silu(z, hn, z);
    kron(z, ly.w2a, ly.w2b, g.ba, g.bb, t1, t2);
    for (uint32_t c = 0; c < hn; ++c) z[c] = ly.d3[c] * t2[p2_[c]];
    kron(z, ly.w3a, ly.w3b, g.ba, g.bb, t1, t2);
    for (uint32_t c = 0; c < D; ++c) y[c] = (bx[c] + ly.d4[c] * t2[c]) - u[c];
    float *X = w.X + size_t(i) * g.nd;
    mhc_scatter(a_post_[l], b_post_ + l * N, w.pb + i * N, w.pr + size_t(i) * N * N, li % N, y, N, D, X,
                w.Xs + size_t(i) * g.nd);
    float *cell = w.cell + size_t(i) * D;  // confidence cell: mean over lanes after the layer
    if (has_conf_) {  // cheap; pool_cells skips it for a state that does not pool
        lane_mean(X, N, D, cell);
    }
}

// §1.4 input of row i: the prepared zc(mean of lanes; final_norm) into hfh[cols_pad].
void Needle3Model::lm_input(Work &w, uint32_t i, float *hfh) const {
    const Needle3Geometry &g = g_;
    lane_mean(w.X + size_t(i) * g.nd, g.n, g.d, w.hf);
    zcrms(w.hf, final_norm_, g.d, w.hf);
    cq_prepare_input(w.hf, g.d, embedding_.cols_pad, embedding_.group, hfh);
}

// §1.4: tied LM head of row i, out_vocab rows.
void Needle3Model::lm_head(Work &w, uint32_t i, float *logits) const {
    lm_input(w, i, w.hfh);
    cq_matmul(embedding_, w.hfh, embedding_.cols_pad, 1, 0, g_.OV, logits, g_.OV);
}

// §1.4 of rows 0..n-1 into logits[i]: inputs in w.hh (free after the last layer, pd >= cols_pad),
// products in the scratch before it (free too).
void Needle3Model::lm_head_many(Work &w, uint32_t n, float *const *logits) const {
    for (uint32_t i = 0; i < n; ++i) lm_input(w, i, w.hh + i * w.pd);
    lm_head_rows(embedding_, g_.OV, w.hh, w.pd, n, w.buf.data(), size_t(w.hh - w.buf.data()), logits);
}

}  // namespace needle
