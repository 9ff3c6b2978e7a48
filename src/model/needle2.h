// Needle 2: weights bound from a validated v2 container, per-sequence state, and the forward
// pass of model-v2.md §3 over a chunk of positions (a decode step is a chunk of one).
#pragma once

#include <memory>
#include <vector>

#include "container/cact_v2.h"
#include "kernels/kernels.h"
#include "model/model.h"

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

class Needle2Model final : public Model {
public:
    Needle2Model(std::shared_ptr<const FileBytes> bytes, const ContainerV2 &c, int n_threads);

    std::unique_ptr<Sequence> new_sequence(const SequenceOptions &opt) const override;
    std::unique_ptr<Workspace> new_workspace(uint32_t capacity) const override;
    void forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                 float *logits) const override;

    const Needle2Geometry &geometry() const { return g_; }

private:
    struct Seq;
    struct Work;

    std::shared_ptr<const FileBytes> bytes_;
    Needle2Geometry g_;
    uint32_t default_window_;  // effective header window, model-v2.md §4.2 (0 = full causal)

    std::vector<float> arena_;  // FP16 tensors and CQ norms converted to f32, LUTs, RoPE frequencies
    CqBlockStore blocked_;      // rows-in-lanes copies of the matmul matrices (kernels.h)
    CqMatrix embedding_, phi_pre_, phi_post_, phi_res_;
    std::vector<Needle2Layer> layers_;
    std::vector<Needle2EngramSite> sites_;
    std::vector<int32_t> site_of_layer_;  // -1 or the site index applied at that layer
    const float *a_pre_, *a_post_, *a_res_, *b_pre_, *b_post_, *b_res_, *final_norm_;
    const float *rope_inv_freq_;  // [hd/2]

    void bind(const ContainerV2 &c);
    void embed(Work &w, const uint32_t *tokens, uint32_t n) const;
    void rope_rows(Work &w, uint32_t p0, uint32_t n) const;
    void engram(Seq &s, Work &w, uint32_t p0, uint32_t n) const;
    void layer(Seq &s, Work &w, uint32_t l, uint32_t p0, uint32_t n) const;
    void attention(Seq &s, Work &w, uint32_t l, uint32_t p0, uint32_t n) const;
    void block_tail(Work &w, uint32_t l, uint32_t i) const;
    void lm_head(Work &w, uint32_t i, float *logits) const;
};

// Effective window of a v2 header (model-v2.md §4.2); 0 = full causal.
uint32_t needle2_effective_window(const HeaderV2 &h);

}  // namespace needle
