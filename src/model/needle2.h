// Needle 2: weights bound from a validated v2 container, per-sequence state, and the forward
// pass of model-v2.md §3 over a chunk of positions (a decode step is a chunk of one).
#pragma once

#include <memory>
#include <vector>

#include "container/cact_v2.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/model_common.h"

namespace needle {

struct Needle2Layer {
    const float *norm_in, *q_norm, *k_norm, *post_norm, *pre_hada, *d1, *d2, *d3;
    float attn_gate;  // pre-sigmoid scalar
    CqMatrix q, k, v, gate, out;
};

struct Needle2EngramSite {
    uint32_t layer;
    CqMatrix tables, key_proj, value_proj;
    const float *taps;  // [taps][D]
};

struct Needle2Geometry {
    uint32_t V, D, H, K, hd, A, Kd, L, n, Nh, Tmax;
    uint32_t S, T, slots, sub, F, taps, dil, heads_e, num_orders, orders[4];
    uint32_t G;                                // CQ group
    uint32_t D_pad, A_pad, F_pad, nD, nD_pad;  // prepared-input widths
    float rope_theta;
};

// One probe head bound from the container (§8): probes [P][D] and bias [out] as f32; proj
// [out][P*D] read in place from the record (FP16 or FP32, proj_f16): it is used only when a head
// output is asked for, and an f32 copy cost ~1 MB and ~2.5 M instructions of load for needle2.
// `first` = index of its first probe among all heads' probes in the pool.
struct Needle2Head {
    ProbeHead kind;
    uint32_t P, out, first;
    const float *probes, *bias;
    const uint8_t *proj;
    bool proj_f16;
    Model::ByteSpan stored[3];  // the records' bytes: probes, proj, bias
};

// Online pooling state of one sequence (model-v2.md §7.2), all in double: for every cell index
// c (0 = embedding, l+1 = after layer l) and every probe k of every head, the running maximum
// score m, the denominator s = Σ exp(z - m) and acc[D] = Σ exp(z - m) · cell, each fed in
// position order. Keeping the cell indices apart makes the result independent of how the
// positions were chunked (a chunk runs layer by layer); they are merged when read.
struct ProbePool {
    uint32_t cells = 0, probes = 0, D = 0;
    std::vector<double> acc;      // [cells][probes][2 + D]: m, s, acc
    std::vector<double> pooled;   // [D] scratch of probe_head_output
    std::vector<double> out;      // [max out] scratch of probe_head_output
    double *at(uint32_t c, uint32_t k) { return acc.data() + (size_t(c) * probes + k) * (2 + D); }
    const double *at(uint32_t c, uint32_t k) const { return acc.data() + (size_t(c) * probes + k) * (2 + D); }
    void reset();
};

class Needle2Model final : public Model {
public:
    Needle2Model(std::shared_ptr<const FileBytes> bytes, const ContainerV2 &c, int n_threads, bool fast = false);

    std::unique_ptr<Sequence> new_sequence(const SequenceOptions &opt) const override;
    std::unique_ptr<Workspace> new_workspace(uint32_t capacity) const override;
    void forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                 float *logits) const override;
    void forward_many(Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
                      float *const *logits) const override;

    const Needle2Geometry &geometry() const { return g_; }

    uint32_t probe_head_dim(ProbeHead h) const override;
    void probe_head_output(const Sequence &seq, ProbeHead h, float *out) const override;
    std::vector<ByteSpan> probe_head_tensors(ProbeHead h) const override;

private:
    struct Seq;
    struct Part;
    struct Work;

    std::shared_ptr<const FileBytes> bytes_;
    Needle2Geometry g_;
    uint32_t default_window_;  // effective header window, model-v2.md §4.2 (0 = full causal)

    Arena arena_;  // FP16 tensors and CQ norms converted to f32, LUTs, RoPE frequencies
    CqBlockStore blocked_;      // rows-in-lanes copies of the matmul matrices (kernels.h)
    bool fast_ = false;         // NEEDLE_PRECISION_FAST: the matmul matrices run int8 (cq_fast.h)
    CqMatrix embedding_, phi_pre_, phi_post_, phi_res_;
    std::vector<Needle2Layer> layers_;
    std::vector<Needle2EngramSite> sites_;
    std::vector<int32_t> site_of_layer_;  // -1 or the site index applied at that layer
    const float *a_pre_, *a_post_, *a_res_, *b_pre_, *b_post_, *b_res_, *final_norm_;
    const float *rope_inv_freq_;  // [hd/2]

    // Probe heads (needle2_heads.cpp).
    std::vector<float> head_arena_;
    std::vector<Needle2Head> heads_;
    uint32_t head_probes_ = 0;  // P summed over the heads
    void bind_heads(const ContainerV2 &c);
    void init_pool(ProbePool &pool) const;
    // Pools cell c of positions 0..n-1 of a chunk: lanes X [n][n_lanes*D] (c = 0: lane 0 is
    // e0), tokens [n] (PAD positions are skipped), scratch [n][D].
    void pool_cells(ProbePool &pool, uint32_t c, const float *X, const uint32_t *tokens, uint32_t n,
                    float *scratch) const;
    void head_output(ProbePool &pool, ProbeHead kind, float *out) const;

    void bind(const ContainerV2 &c);
    void run(const Part *parts, uint32_t np, Work &w, const uint32_t *tokens, uint32_t rows) const;
    void embed(Work &w, const uint32_t *tokens, uint32_t n) const;
    void rope_rows(Work &w, uint32_t i0, uint32_t p0, uint32_t n) const;
    void engram(const Part *parts, uint32_t np, Work &w, uint32_t n) const;
    void pool_chunk(const Part *parts, uint32_t np, Work &w, uint32_t c, const uint32_t *tokens) const;
    void layer(const Part *parts, uint32_t np, Work &w, uint32_t l, uint32_t n, const uint32_t *tokens) const;
    void attention(Seq &s, Work &w, uint32_t l, uint32_t p0, uint32_t n, uint32_t i0) const;
    void attention_many(const Part *parts, uint32_t np, Work &w, uint32_t l) const;
    void qk_rope(Work &w, uint32_t l, uint32_t i) const;
    void kv_store(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i, uint32_t kv) const;
    void qk_store(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i) const;
    void attend(Seq &s, Work &w, uint32_t l, uint32_t p, uint32_t i, uint32_t kv) const;
    void gate_out(Work &w, uint32_t i) const;
    void block_tail(Work &w, uint32_t l, uint32_t i) const;
    void lm_input(Work &w, uint32_t i, float *hfh) const;
    void lm_head(Work &w, uint32_t i, float *logits) const;
    void lm_head_many(Work &w, uint32_t n, float *const *logits) const;
};

// Effective window of a v2 header (model-v2.md §4.2); 0 = full causal.
uint32_t needle2_effective_window(const HeaderV2 &h);

}  // namespace needle
