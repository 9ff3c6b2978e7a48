// Scalar reference of the FAST precision (cq_fast.h): activation quantisation and the int8 CQ
// matmul over the stored form. Every ISA's FAST kernels must give these bits (test_fast.cpp);
// the vectorised ones also fall back to these for matrices without their rows-in-lanes copy.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernel_table.h"

namespace needle {
namespace scalar {

void cq_fast_quantize(const float *xh, size_t xh_stride, size_t n_pos, uint32_t cols_pad, uint32_t group,
                      int8_t *q2, size_t q2_stride, int8_t *q4, size_t q4_stride, float *scale, int32_t *sum) {
    const uint32_t ng = cols_pad / group, gb2 = cq_fast_group_bytes(group, 2), gb4 = cq_fast_group_bytes(group, 4);
    for (size_t p = 0; p < n_pos; ++p)
        for (uint32_t g = 0; g < ng; ++g) {
            const float *x = xh + p * xh_stride + size_t(g) * group;
            float amax = 0.0f;
            for (uint32_t k = 0; k < group; ++k) amax = std::max(amax, std::fabs(x[k]));
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int8_t *d2 = q2 ? q2 + p * q2_stride + size_t(g) * gb2 : nullptr;
            int8_t *d4 = q4 ? q4 + p * q4_stride + size_t(g) * gb4 : nullptr;
            if (d2) std::memset(d2, 0, gb2);  // chunk padding of a group shorter than a chunk
            if (d4) std::memset(d4, 0, gb4);
            int32_t s = 0;
            for (uint32_t k = 0; k < group; ++k) {
                const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(x[k] * inv)));
                const int8_t q = int8_t(v);
                s += q;
                if (d2) d2[cq_fast_pos(k, 2)] = q;
                if (d4) d4[cq_fast_pos(k, 4)] = q;
            }
            scale[p * ng + g] = amax / 127.0f;
            sum[p * ng + g] = s;
        }
}

// Stored index of column k of row r, group g (cq-kernels.md §8; container-v2.md §7.1).
static inline uint32_t stored_index(const CqMatrix &w, const uint8_t *grp, uint32_t k) {
    switch (w.width) {
    case 2: return (grp[k / 4] >> (2 * (k % 4))) & 3u;
    case 4: return (grp[k / 2] >> (4 * (k % 2))) & 15u;
    default: {
        const uint32_t bit = 3 * k, b = bit / 8, sh = bit % 8;
        uint32_t v = grp[b];
        if (sh > 5) v |= uint32_t(grp[b + 1]) << 8;
        return (v >> sh) & 7u;
    }
    }
}

void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride) {
    const CqFastBook bk(w);
    const uint32_t layout = cq_fast_layout(w), gb = cq_fast_group_bytes(w.group, layout);
    const int8_t *q = layout == 2 ? x.q2 : x.q4;
    const size_t qs = layout == 2 ? x.q2_stride : x.q4_stride;
    const uint32_t gbytes = w.group * w.width / 8;
    for (size_t p = 0; p < n_pos; ++p)
        for (uint32_t r = r0; r < r0 + count; ++r) {
            const uint8_t *row = w.packed + size_t(r) * w.row_bytes;
            float acc = 0.0f;
            for (uint32_t g = 0; g < w.ngroups; ++g) {
                const int8_t *xq = q + p * qs + size_t(g) * gb;
                int32_t isum = 0;
                for (uint32_t k = 0; k < w.group; ++k)
                    isum += int32_t(bk.wq[stored_index(w, row + size_t(g) * gbytes, k)]) * xq[cq_fast_pos(k, layout)];
                const float t = w.norms[size_t(r) * w.ngroups + g] * x.scale[p * x.ngroups + g];
                acc = acc + float(isum) * t;
            }
            y[p * y_stride + (r - r0)] = acc * bk.scale;
        }
}

}  // namespace scalar
}  // namespace needle
