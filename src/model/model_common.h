// Pieces shared by the Needle 2 and Needle 3 forward passes: the load-time float arena, CQ
// matrix binding with its level tables, float-record conversion, per-position parallel loops,
// and the mHC scatter-up (its Sinkhorn is a kernel, kernels.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "container/cact_records.h"
#include "core/huge_pages.h"
#include "core/parallel.h"
#include "kernels/kernels.h"

namespace needle {

class FileBytes;

inline uint32_t round_up(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }

// The model's load-time floats (FP16 records and CQ norms converted to f32, level tables, RoPE
// frequencies): sized once before anything is converted, then handed out in order.
class Arena {
public:
    // n zeroed floats; earlier cells are dropped. From 1 MB up the block is whole 2 MB pages
    // (core/huge_pages.h): needle2's 1.7 MB arena took ~420 first-touch faults, 0.7-1.0 ms of a
    // first load in a shadow-paging VM, against ~0.2 ms for one huge page (RSS +0.3 MB).
    void reset(size_t n);
    float *take(size_t n);  // throws Error(INTERNAL) when sized too small

private:
    HugeVector<float> v_;
    size_t used_ = 0;
};

// Product of the record's shape (v2 float records: shape == element count).
uint64_t elements(const TensorRecord &t);

// n values of an FP16 or FP32 record into out.
void to_f32(const TensorRecord &t, uint64_t n, float *out);

// Level tables for CQ matrices (cq-kernels.md §8): the 28 stored levels, byte LUTs for widths
// 2 and 4, and the ternary levels of one group size.
struct CqTables {
    const float *lv2, *lv3, *lv4, *lvt, *lut2, *lut4, *lutt;
    static constexpr size_t kFloats = 4 + 8 + 16 + 4 + 1024 + 512 + 1024;
    static constexpr size_t kTernaryFloats = 4 + 1024;
};
CqTables make_cq_tables(const float *codebook, uint32_t ternary_group, Arena &ar);
// Replaces the ternary tables of t by those of `group` (s = 1.2240064 / sqrt(group)).
void set_ternary_group(CqTables &t, uint32_t group, Arena &ar);

// A CqMatrix over record t (shape[0] x shape[1], its own group; bits low byte), norms converted
// into the arena (rows * ngroups floats).
CqMatrix bind_cq(const TensorRecord &t, const CqTables &tables, Arena &ar);
inline size_t cq_norm_floats(const TensorRecord &t) {
    return size_t(t.shape[0]) * ((uint64_t(t.shape[1]) + t.group - 1) / t.group);
}

// Load-time step shared by both models: gives the matrices cq_matmul reads (`mats`) the active
// kernels' rows-in-lanes copy in `store` (cq_block_matrices, kernels.h; a no-op for kernels that
// read the stored form). Their file pages stay mapped until load_model releases the whole file.
// fast: the model was loaded with NEEDLE_PRECISION_FAST; these matrices then run the int8 kernels
// (CqMatrix::fast, cq_fast.h). Throws std::bad_alloc only.
void block_matmul_weights(const std::vector<CqMatrix *> &mats, bool fast, CqBlockStore &store);

// Runs fn(i) for every position of a chunk, split over the caller's task arena (one position
// runs inline: a decode step).
template <class Fn>
void for_positions(uint32_t n, const Fn &fn) {
    if (n == 1) {
        fn(0u);
        return;
    }
    parallel_for(0, n, 1, [&](uint32_t b, uint32_t e) {
        for (uint32_t i = b; i != e; ++i) fn(i);
    });
}

// Engram value convolution at position p (model-v2.md §2.4, model-v3.md §1.2):
// ev[c] = sum_j taps[j][c] * v_{p - j*dil}[c] over j < n_taps with j*dil <= p and
// p >= j*order_gate (v3's max_order clause; 0 = none). v_q comes from the chunk when q >= p0
// (chunk + (q - p0) * chunk_stride), else from the ring (row q % ring_rows). ev[d] is overwritten.
void engram_conv_at(uint32_t p, uint32_t p0, uint32_t n_taps, uint32_t dil, uint32_t order_gate,
                    const float *taps, const float *chunk, size_t chunk_stride, const float *ring,
                    uint32_t ring_rows, uint32_t d, float *ev);
// After a chunk of n positions at p0: the last ring_rows pre-conv values go into the ring.
void engram_ring_store(uint32_t p0, uint32_t n, const float *chunk, size_t chunk_stride, float *ring,
                       uint32_t ring_rows, uint32_t d);

// mHC residual routing (model-v2.md §3 step 5.8 = model-v3.md §1.3) of n rows at once:
// p_res[i] (N x N each, rows i < n) := sinkhorn(a_res p_res[i] + b_res). The Sinkhorn kernel
// takes groups of rows (split over the caller's arena for a prefill chunk); each row gets the
// bits it gets alone.
void mhc_routing(float a_res, const float *b_res, uint32_t N, uint32_t n, float *p_res);

// mHC scatter-up (model-v2.md §3 steps 5.7-5.9 = model-v3.md §1.3) of one position:
// hp_i = 2 sigma(a_post p_post_i + b_post_i + (i == active ? 0 : -4)),
// lane_i <- sum_j R_ij lane_j + hp_i y with R the position's routing (mhc_routing).
// X [N][D] lanes (updated), Xs [N][D] scratch, y [D]; N <= 64.
void mhc_scatter(float a_post, const float *b_post, const float *p_post, const float *R, uint32_t active,
                 const float *y, uint32_t N, uint32_t D, float *X, float *Xs);

// Mean over the N lanes of X [N][d] into mean[d] (model-v2.md §3 step 6, model-v3.md §1.4;
// also Needle 3's confidence cell): lanes summed in order 0..N-1, then divided by N.
void lane_mean(const float *X, uint32_t N, uint32_t d, float *mean);

// Tied LM head of n prepared rows (x + i * x_stride, head.cols_pad floats each) into logits[i]
// (out_rows floats each), each embedding group decoded once per pass: products go to the
// scratch y (y_floats floats), as many rows per pass as fit, then are copied out; with room for
// fewer than 2 rows each row goes straight to its logits. Per row the bits of a one-row call
// (cq_matmul does not depend on the row count).
void lm_head_rows(const CqMatrix &head, uint32_t out_rows, const float *x, size_t x_stride, uint32_t n, float *y,
                  size_t y_floats, float *const *logits);

}  // namespace needle
