// FAST precision of the CQ matmul (needle_model_params.precision = NEEDLE_PRECISION_FAST): int8
// activations times int8 codebook levels, integer dot products, one float epilogue per group.
// Shared by the scalar reference (kernels_fast.cpp) and the per-ISA kernels (isa/kernels_i8.cpp).
//
// Numerics (the same in every ISA, so every ISA gives the bits of the scalar reference):
//  * activation: each group g of a prepared input xh (cq-kernels.md §6, already rotated) is
//    quantised symmetrically, amax = max|xh_g|, xs[g] = amax / 127,
//    q[k] = clamp(nearbyint(xh[k] * (127 / amax)), -127, 127) (all zero when amax == 0);
//  * weights: the matrix's book (2^width levels; ternary by crumb) is quantised once,
//    bs = max|level| / 127, wq[i] = nearbyint(level[i] * (127 / max|level|));
//  * isum[r][g] = sum_k wq[idx[r][k]] * q[k], exact in int32 (|isum| <= G * 127^2 < 2^31);
//  * y[r] = bs * acc, acc = sum over g in increasing order of float(isum) * (nrm[r][g] * xs[g])
//    (float(isum) is exact below 2^24, i.e. G <= 1024, and rounds to nearest the same way in
//    every ISA above; mul then add, no FMA). dispatch.cpp quantises each input once per call
//    (stack buffers of 32 KB per layout, positions in tiles); a wider input runs EXACT.
// Integer sums are exact in any order, so the ISAs may split them across lanes freely; the
// float epilogue is the same sequence of IEEE operations per row everywhere. A position's
// result depends on nothing but its own input, so batched prefill equals sequential decode.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cq_matrix.h"

namespace needle {

// Quantised prepared inputs of n_pos positions for one cq_matmul_fast call. Column order inside
// a group follows the rows-in-lanes words (cq_matrix.h) so that a shifted, masked index word
// meets its 4 activation bytes as one 32-bit broadcast:
//  * layout 2 (field width 2: widths 2 and ternary): chunks of 16 columns; byte 4j + i of a
//    chunk holds column 4i + j (i, j < 4);
//  * layout 4 (field width 4: widths 3 and 4): chunks of 8 columns; byte 4j + i holds column
//    2i + j (i < 4, j < 2).
// A group occupies cq_fast_group_bytes(G, layout) bytes (whole chunks; padding bytes are 0).
struct CqFastInput {
    const int8_t *q2 = nullptr;   // layout 2, or null when no product of the call needs it
    const int8_t *q4 = nullptr;   // layout 4, or null
    size_t q2_stride = 0, q4_stride = 0;  // bytes per position
    const float *scale = nullptr;  // [n_pos][ngroups] xs
    const int32_t *sum = nullptr;  // [n_pos][ngroups] sum of the group's q (for unsigned-weight dots)
    uint32_t ngroups = 0;          // per position (scale/sum stride)
};

inline uint32_t cq_fast_layout(const CqMatrix &w) { return w.width == 2 ? 2u : 4u; }
inline uint32_t cq_fast_chunk(uint32_t layout) { return layout == 2 ? 16u : 8u; }
inline uint32_t cq_fast_group_bytes(uint32_t group, uint32_t layout) {
    const uint32_t c = cq_fast_chunk(layout);
    return (group + c - 1) / c * c;
}
// Byte offset within a group of column k (k < group) in `layout`.
inline uint32_t cq_fast_pos(uint32_t k, uint32_t layout) {
    const uint32_t c = cq_fast_chunk(layout), base = k / c * c, r = k % c;
    return layout == 2 ? base + 4 * (r % 4) + r / 4 : base + 4 * (r % 2) + r / 2;
}

// The int8 book of a matrix: levels wq[16] (entries past 2^width are 0) and the scale bs.
struct CqFastBook {
    int8_t wq[16];
    float scale;
    explicit CqFastBook(const CqMatrix &w) {
        const uint32_t n = w.width == 2 ? 4u : w.width == 3 ? 8u : 16u;
        float amax = 0.0f;
        for (uint32_t i = 0; i < n; ++i) amax = std::fabs(w.levels[i]) > amax ? std::fabs(w.levels[i]) : amax;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (uint32_t i = 0; i < 16; ++i) wq[i] = i < n ? int8_t(std::nearbyint(w.levels[i] * inv)) : int8_t(0);
        scale = amax / 127.0f;
    }
};

}  // namespace needle
