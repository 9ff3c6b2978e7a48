// Needle 3: weights bound from a validated v3 container (optionally one depth-ladder rung),
// per-sequence state (per-layer KV rings, Q/K/V conv tails, Engram tails, online confidence
// pooling) and the forward pass of model-v3.md §1-§4 over a chunk of positions.
#pragma once

#include <memory>
#include <vector>

#include "container/cact_v3.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/model_common.h"

namespace needle {

// One layer as run (ladder rung: the kept layers renumbered 0..D-1, model-v3.md §5).
struct Needle3Layer {
    uint32_t src;   // layer index in the container (selects a_*, b_*, Phi rows)
    bool global;    // attends over every position (else the sliding window)
    int32_t site;   // Engram site applied here, or -1
    uint32_t rank;  // HadaMlp cond_rank
    const float *norm_in, *qtaps, *ktaps, *vtaps, *q_norm, *k_norm, *post_norm, *pre_hada;
    const float *d1, *d2, *b2, *d3, *d4, *w1a, *w1b, *w2a, *w2b, *w3a, *w3b, *cond_v, *cond_u;
    float attn_gate;  // pre-sigmoid
    CqMatrix q, k, v, gate, out;
};

struct Needle3Site {
    CqMatrix tables, key_proj, value_proj;
    const float *taps;  // [Te][d]
};

// Confidence head (code 2) restricted to the cells of the rung: probes/gain/row_bias of cells
// 0 and l+1 for kept l, as f32 (probes and query dequantised once at load).
struct Needle3Confidence {
    uint32_t cells = 0, k = 0, Q = 0;  // cells as run, probes per cell, queries
    const float *probes = nullptr;     // [cells*k][d]
    const float *gain = nullptr;       // [cells*k]
    const float *query = nullptr;      // [Q][d]
    const float *row_bias = nullptr;   // [Q][cells*k]
    CqMatrix proj;                     // [1, Q*d] (first output used)
    float bias = 0.0f;
};

struct Needle3Geometry {
    uint32_t V, OV, d, H, G, dq, dv, L, n, hn, ba, bb, Tmax, W, T;
    uint32_t qd, kd, vd, od, nd;
    uint32_t slots, sub, n_tables, heads_e, n_orders, orders[4], Te, dil, seed_stride, max_order;
    uint32_t S;  // Engram sites kept by the rung
    float rope_theta;
};

class Needle3Model final : public Model {
public:
    // depth 0 = all layers; 2..num_layers = that ladder rung. Throws Error(INVALID_ARGUMENT) for
    // other depths, Error(FORMAT) for a bad tokenizer blob.
    Needle3Model(std::shared_ptr<const FileBytes> bytes, const ContainerV3 &c, int n_threads, uint32_t depth,
                 bool fast = false);

    std::unique_ptr<Sequence> new_sequence(const SequenceOptions &opt) const override;
    std::unique_ptr<Workspace> new_workspace(uint32_t capacity) const override;
    void forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                 float *logits) const override;
    void forward_many(Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
                      float *const *logits) const override;
    uint32_t probe_head_dim(ProbeHead h) const override;
    void probe_head_output(const Sequence &seq, ProbeHead h, float *out) const override;

    const Needle3Geometry &geometry() const { return g_; }
    const std::vector<uint32_t> &kept_layers() const { return kept_; }

private:
    struct Seq;
    struct Part;
    struct Work;

    std::shared_ptr<const FileBytes> bytes_;
    Needle3Geometry g_;
    std::vector<uint32_t> kept_;  // container layers run, ascending
    Arena arena_;
    CqBlockStore blocked_;  // rows-in-lanes copies of the matmul matrices (kernels.h)
    bool fast_ = false;     // NEEDLE_PRECISION_FAST: the matmul matrices run int8 (cq_fast.h)
    CqMatrix embedding_, phi_pre_, phi_post_, phi_res_;
    std::vector<Needle3Layer> layers_;
    std::vector<Needle3Site> sites_;
    std::vector<uint32_t> p1_, p2_;
    const float *a_pre_, *a_post_, *a_res_, *b_pre_, *b_post_, *b_res_, *final_norm_;
    const float *rope_inv_freq_;  // [dq/2]
    bool has_conf_ = false;
    Needle3Confidence conf_;

    void bind(const ContainerV3 &c, uint32_t depth);
    void bind_confidence(const ContainerV3 &c, uint32_t first, Arena &ar, const CqTables &tb);
    void run(const Part *parts, uint32_t np, Work &w, const uint32_t *tokens, uint32_t rows) const;
    void embed(Work &w, const uint32_t *tokens, uint32_t n) const;
    void engram(const Part *parts, uint32_t np, Work &w, uint32_t n) const;
    void layer(const Part *parts, uint32_t np, Work &w, uint32_t li, uint32_t n) const;
    void qkv_conv(const Part &pa, Work &w, uint32_t li) const;
    void attention(const Part &pa, Work &w, uint32_t li) const;
    void attention_many(const Part *parts, uint32_t np, Work &w, uint32_t li) const;
    struct Rings;
    void qk_rope(const Seq &s, Work &w, uint32_t li, uint32_t i) const;
    void kv_store(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i, uint32_t kv) const;
    void qk_store(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i) const;
    void attend(Seq &s, Work &w, uint32_t li, uint32_t p, uint32_t i, uint32_t kv, float *scores, size_t s_stride) const;
    void gate_out(Work &w, uint32_t i) const;
    void block_tail(Work &w, uint32_t li, uint32_t i) const;
    void pool_cells(const Part &pa, Work &w, uint32_t cell) const;
    void lm_input(Work &w, uint32_t i, float *hfh) const;
    void lm_head(Work &w, uint32_t i, float *logits) const;
    void lm_head_many(Work &w, uint32_t n, float *const *logits) const;
};

// Layer order of the depth ladder of an L-layer model (model-v3.md §5).
std::vector<uint32_t> ladder_order(uint32_t L);

}  // namespace needle
