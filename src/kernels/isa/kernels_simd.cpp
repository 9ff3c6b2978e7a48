// The vectorised kernels: one xsimd source, compiled once per instruction set with
//   NEEDLE_ISA_NS      namespace of this build (isa_sse4_2, isa_avx2, isa_avx512, isa_neon)
//   NEEDLE_ISA_NAME    its name as reported and as NEEDLE_FORCE_ISA takes it
//   NEEDLE_XSIMD_ARCH  the xsimd architecture tag (xsimd 8.1 spelling)
// and that ISA's compiler flags (CMakeLists.txt). Nothing here may be an inline symbol shared
// with baseline objects (no std:: templates left un-inlined), or the linker could hand AVX code
// to a baseline caller: everything lives in an ISA-specific namespace.
//
// cq_matmul decodes each weight group once and applies it to every position with the same
// summation order, so within one ISA a matvec equals a row of a batched matmul bit for bit
// (cq-kernels.md §7.1, §9). Results differ across ISAs by rounding only (FMA vs mul+add).
#include <cmath>
#include <cstring>

#include <xsimd/xsimd.hpp>

#include "kernels/kernel_table.h"

namespace needle {
namespace NEEDLE_ISA_NS {
namespace {

using Arch = NEEDLE_XSIMD_ARCH;
using Vec = xsimd::batch<float, Arch>;
constexpr uint32_t W = uint32_t(Vec::size);

inline Vec load(const float *p) { return Vec::load_unaligned(p); }

// sum a[k]*b[k]: four W-wide accumulators over blocks of 4W, then W-wide steps, then a tail.
inline float dot(const float *a, const float *b, uint32_t n) {
    Vec acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
    uint32_t k = 0;
    for (; k + 4 * W <= n; k += 4 * W) {
        acc0 = xsimd::fma(load(a + k), load(b + k), acc0);
        acc1 = xsimd::fma(load(a + k + W), load(b + k + W), acc1);
        acc2 = xsimd::fma(load(a + k + 2 * W), load(b + k + 2 * W), acc2);
        acc3 = xsimd::fma(load(a + k + 3 * W), load(b + k + 3 * W), acc3);
    }
    for (; k + W <= n; k += W) acc0 = xsimd::fma(load(a + k), load(b + k), acc0);
    float s = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
    for (; k < n; ++k) s += a[k] * b[k];
    return s;
}

// y[i] += s * x[i]
inline void axpy(float s, const float *x, float *y, uint32_t n) {
    const Vec vs(s);
    uint32_t k = 0;
    for (; k + W <= n; k += W) xsimd::fma(vs, load(x + k), load(y + k)).store_unaligned(y + k);
    for (; k < n; ++k) y[k] += s * x[k];
}

inline void scale(float *x, float s, uint32_t n) {
    const Vec vs(s);
    uint32_t k = 0;
    for (; k + W <= n; k += W) (load(x + k) * vs).store_unaligned(x + k);
    for (; k < n; ++k) x[k] *= s;
}

// Levels of one group's indices, norm not applied (cq-kernels.md §8): byte LUTs for widths 2
// (and ternary) and 4, 24-bit loads for width 3.
void decode_group(const CqMatrix &w, uint32_t r, uint32_t g, float *out) {
    const uint32_t group_bytes = w.group * w.width / 8;
    const uint8_t *src = w.packed + size_t(r) * w.row_bytes + size_t(g) * group_bytes;
    if (w.width == 2) {
        for (uint32_t b = 0; b < group_bytes; ++b) std::memcpy(out + 4 * b, w.lut + 4 * src[b], 16);
    } else if (w.width == 4) {
        for (uint32_t b = 0; b < group_bytes; ++b) std::memcpy(out + 2 * b, w.lut + 2 * src[b], 8);
    } else {
        for (uint32_t b = 0; b < group_bytes; b += 3) {
            const uint32_t bits = uint32_t(src[b]) | uint32_t(src[b + 1]) << 8 | uint32_t(src[b + 2]) << 16;
            for (uint32_t k = 0; k < 8; ++k) out[(b / 3) * 8 + k] = w.levels[(bits >> (3 * k)) & 7u];
        }
    }
}

void fwht(float *x, uint32_t m) {
    uint32_t h = 1;
    for (; h < m && h < W; h *= 2)  // short strides: scalar butterflies
        for (uint32_t i = 0; i < m; i += 2 * h)
            for (uint32_t j = i; j < i + h; ++j) {
                const float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    for (; h < m; h *= 2)  // the same additions, W at a time
        for (uint32_t i = 0; i < m; i += 2 * h)
            for (uint32_t j = i; j < i + h; j += W) {
                const Vec a = load(x + j), c = load(x + j + h);
                (a + c).store_unaligned(x + j);
                (a - c).store_unaligned(x + j + h);
            }
    scale(x, 1.0f / std::sqrt(float(m)), m);
}

void cq_prepare_input(const float *x, uint32_t cols, uint32_t cols_pad, uint32_t group, float *xh) {
    std::memcpy(xh, x, sizeof(float) * cols);
    for (uint32_t c = cols; c < cols_pad; ++c) xh[c] = 0.0f;  // stale padding would leak
    for (uint32_t g = 0; g < cols_pad; g += group) fwht(xh + g, group);
}

void cq_matmul(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0,
               uint32_t count, float *y, size_t y_stride) {
    alignas(64) float ug[4096];  // group <= 4096 is a loader rule
    for (uint32_t r = r0; r < r0 + count; ++r) {
        const float *nrm = w.norms + size_t(r) * w.ngroups;
        float *yr = y + (r - r0);
        for (size_t p = 0; p < n_pos; ++p) yr[p * y_stride] = 0.0f;
        for (uint32_t g = 0; g < w.ngroups; ++g) {
            decode_group(w, r, g, ug);
            const float *xg = xh + size_t(g) * w.group;
            for (size_t p = 0; p < n_pos; ++p)
                yr[p * y_stride] += nrm[g] * dot(ug, xg + p * xh_stride, w.group);  // norm after dot (§7)
        }
    }
}

void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out) {
    alignas(64) float buf[4096];
    for (uint32_t g = 0; g < w.ngroups; ++g) {
        decode_group(w, r, g, buf);
        scale(buf, w.norms[size_t(r) * w.ngroups + g], w.group);
        fwht(buf, w.group);
        const uint32_t c0 = g * w.group;
        const uint32_t n = w.cols > c0 ? (w.cols - c0 < w.group ? w.cols - c0 : w.group) : 0;
        std::memcpy(out + c0, buf, sizeof(float) * n);  // padded columns are discarded
    }
}

void rms_unit(const float *x, uint32_t n, float *y) {
    const float inv = 1.0f / std::sqrt(dot(x, x, n) / float(n) + 1e-6f);
    for (uint32_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

void zcrms(const float *x, const float *gamma, uint32_t n, float *y) {
    const float rms = std::sqrt(dot(x, x, n) / float(n) + 1e-6f);
    for (uint32_t i = 0; i < n; ++i) y[i] = (1.0f + gamma[i]) * x[i] / rms;
}

void rope(float *x, uint32_t dim, const float *cos_row, const float *sin_row) {
    const uint32_t half = dim / 2;
    for (uint32_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos_row[i] - b * sin_row[i];
        x[i + half] = b * cos_row[i] + a * sin_row[i];
    }
}

void attention_head(const float *q, const float *k_ring, const float *v_ring, uint32_t qk_dim,
                    uint32_t v_dim, uint32_t ring, uint32_t lo, uint32_t hi, float *scores, float *out) {
    const float sc = std::sqrt(float(qk_dim));
    const uint32_t n = hi - lo + 1;
    float mx = -INFINITY;
    for (uint32_t j = 0; j < n; ++j) {
        scores[j] = dot(q, k_ring + size_t((lo + j) % ring) * qk_dim, qk_dim) / sc;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
    }
    for (uint32_t d = 0; d < v_dim; ++d) out[d] = 0.0f;
    for (uint32_t j = 0; j < n; ++j)
        axpy(scores[j] / sum, v_ring + size_t((lo + j) % ring) * v_dim, out, v_dim);
}

}  // namespace

const KernelTable &table() {
    static const KernelTable t{NEEDLE_ISA_NAME, cq_prepare_input, cq_matmul, cq_dequantize_row, fwht,
                               rms_unit, zcrms, rope, attention_head};
    return t;
}

}  // namespace NEEDLE_ISA_NS
}  // namespace needle
