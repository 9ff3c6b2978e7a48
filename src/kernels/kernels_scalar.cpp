// Portable reference kernels (plain C++), the "scalar" ISA: what NEEDLE_FORCE_ISA=scalar runs
// and what the vectorised tables are tested against. cq_matmul decodes each group once and
// applies it to every position with the same 8-lane summation order, so a matvec equals a row
// of a batched matmul bit for bit (cq-kernels.md §7.1, §9).
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"  // scalar functions share the public names, in namespace scalar

#include <algorithm>
#include <cmath>
#include <cstring>

namespace needle {
namespace scalar {
namespace {

// sum_k a[k]*b[k], k < n (n % 8 == 0): lane k%8 accumulates, lanes summed left to right.
// B is float, or int8_t for an int8 KV row (converted exactly).
template <class B>
inline float dot8(const float *a, const B *b, uint32_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t k = 0; k < n; k += 8)
        for (uint32_t j = 0; j < 8; ++j) acc[j] += a[k + j] * float(b[k + j]);
    float s = acc[0];
    for (uint32_t j = 1; j < 8; ++j) s += acc[j];
    return s;
}

// Any-length dot product with the same lane order, plus a sequential tail.
template <class B>
inline float dot_any(const float *a, const B *b, uint32_t n) {
    const uint32_t n8 = n & ~7u;
    float s = n8 ? dot8(a, b, n8) : 0.0f;
    for (uint32_t k = n8; k < n; ++k) s += a[k] * float(b[k]);
    return s;
}

// Levels of the `group` indices of row r, group g (norm not applied), cq-kernels.md §8.
void decode_group(const CqMatrix &w, uint32_t r, uint32_t g, float *out) {
    const uint32_t group_bytes = w.group * w.width / 8;
    const uint8_t *src = w.packed + size_t(r) * w.row_bytes + size_t(g) * group_bytes;
    switch (w.width) {
    case 2:  // 4 indices per byte (also ternary crumbs, through its own LUT)
        for (uint32_t b = 0; b < group_bytes; ++b) std::memcpy(out + 4 * b, w.lut + 4 * src[b], 16);
        break;
    case 4:  // 2 indices per byte, low nibble first
        for (uint32_t b = 0; b < group_bytes; ++b) std::memcpy(out + 2 * b, w.lut + 2 * src[b], 8);
        break;
    default:  // 3: every 3 bytes hold 8 indices, LSB-first
        for (uint32_t b = 0; b < group_bytes; b += 3) {
            const uint32_t bits = uint32_t(src[b]) | uint32_t(src[b + 1]) << 8 |
                                  uint32_t(src[b + 2]) << 16;
            for (uint32_t k = 0; k < 8; ++k) out[(b / 3) * 8 + k] = w.levels[(bits >> (3 * k)) & 7u];
        }
        break;
    }
}

}  // namespace

void fwht(float *x, uint32_t m) {
    for (uint32_t h = 1; h < m; h *= 2)
        for (uint32_t i = 0; i < m; i += 2 * h)
            for (uint32_t j = i; j < i + h; ++j) {
                const float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    const float scale = 1.0f / std::sqrt(float(m));
    for (uint32_t j = 0; j < m; ++j) x[j] *= scale;
}

void cq_prepare_input(const float *x, uint32_t cols, uint32_t cols_pad, uint32_t group, float *xh) {
    std::memcpy(xh, x, sizeof(float) * cols);
    std::fill(xh + cols, xh + cols_pad, 0.0f);  // stale padding would leak into every row
    for (uint32_t g = 0; g < cols_pad; g += group) fwht(xh + g, group);
}

void cq_matmul(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0,
               uint32_t count, float *y, size_t y_stride) {
    float ug[4096];  // one decoded group; group <= 4096 is a loader rule
    for (uint32_t r = r0; r < r0 + count; ++r) {
        const float *nrm = w.norms + size_t(r) * w.ngroups;
        for (size_t p = 0; p < n_pos; ++p) y[p * y_stride + (r - r0)] = 0.0f;
        for (uint32_t g = 0; g < w.ngroups; ++g) {
            decode_group(w, r, g, ug);
            for (size_t p = 0; p < n_pos; ++p) {
                const float s = dot8(ug, xh + p * xh_stride + size_t(g) * w.group, w.group);
                y[p * y_stride + (r - r0)] += nrm[g] * s;  // norm after the group dot (§7)
            }
        }
    }
}

void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out) {
    float buf[4096];
    for (uint32_t g = 0; g < w.ngroups; ++g) {
        decode_group(w, r, g, buf);
        const float nrm = w.norms[size_t(r) * w.ngroups + g];
        for (uint32_t k = 0; k < w.group; ++k) buf[k] *= nrm;
        fwht(buf, w.group);
        const uint32_t c0 = g * w.group;
        const uint32_t n = std::min(w.group, w.cols - std::min(w.cols, c0));
        std::memcpy(out + c0, buf, sizeof(float) * n);  // padded columns are discarded
    }
}

void rms_unit(const float *x, uint32_t n, float *y) {
    const float ms = dot_any(x, x, n) / float(n);
    const float inv = 1.0f / std::sqrt(ms + 1e-6f);
    for (uint32_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

void zcrms(const float *x, const float *gamma, uint32_t n, float *y) {
    const float ms = dot_any(x, x, n) / float(n);
    const float rms = std::sqrt(ms + 1e-6f);
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

// Softmax attention over rows of type T (float, or int8_t with one scale per slot; f32 rings
// have scale 1, which multiplies exactly, so their bits are those of plain f32 attention).
template <class T>
void attention_rows(const float *q, const KvRing<T> &k, const KvRing<T> &v, uint32_t lo, uint32_t hi,
                    float *scores, float *out) {
    const float scale = std::sqrt(float(k.dim));
    const uint32_t n = hi - lo + 1;
    float mx = -INFINITY;
    for (uint32_t j = 0; j < n; ++j) {
        scores[j] = dot_any(q, k.base + size_t((lo + j) % k.ring) * k.dim, k.dim) * (k.scales ? k.scales[(lo + j) % k.ring] : 1.0f) / scale;
        mx = std::max(mx, scores[j]);
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
    }
    std::fill(out, out + v.dim, 0.0f);
    for (uint32_t j = 0; j < n; ++j) {
        const uint32_t slot = (lo + j) % v.ring;
        const float wj = scores[j] / sum * (v.scales ? v.scales[slot] : 1.0f);
        const T *vr = v.base + size_t(slot) * v.dim;
        for (uint32_t d = 0; d < v.dim; ++d) out[d] += wj * float(vr[d]);
    }
}

// The queries of a group one after another: the reference has no reuse to exploit.
template <class T>
void attention_group(const float *q, size_t q_stride, uint32_t rows, const KvRing<T> &k, const KvRing<T> &v,
                     uint32_t lo, uint32_t hi, float *scores, size_t s_stride, float *out, size_t o_stride) {
    for (uint32_t r = 0; r < rows; ++r)
        attention_rows(q + r * q_stride, k, v, lo, hi, scores + r * s_stride, out + r * o_stride);
}

// Log-sum-exp of n values with stride (model-v2.md §2).
float lse(const float *v, uint32_t n, uint32_t stride) {
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; ++i) mx = std::max(mx, v[i * stride]);
    float s = 0.0f;
    for (uint32_t i = 0; i < n; ++i) s += std::exp(v[i * stride] - mx);
    return mx + std::log(s);
}

void sinkhorn_one(float *m, uint32_t n) {
    for (int it = 0; it < 20; ++it) {
        for (uint32_t i = 0; i < n; ++i) {
            const float r = lse(m + i * n, n, 1);
            for (uint32_t j = 0; j < n; ++j) m[i * n + j] -= r;
        }
        for (uint32_t j = 0; j < n; ++j) {
            const float c = lse(m + j, n, n);
            for (uint32_t i = 0; i < n; ++i) m[i * n + j] -= c;
        }
    }
    for (uint32_t i = 0; i < n * n; ++i) m[i] = std::exp(m[i]);
}

void sinkhorn(float *m, uint32_t n, uint32_t count) {
    for (uint32_t k = 0; k < count; ++k) sinkhorn_one(m + size_t(k) * n * n, n);
}

void silu(const float *x, uint32_t n, float *y) {
    for (uint32_t i = 0; i < n; ++i) y[i] = x[i] * (1.0f / (1.0f + std::exp(-x[i])));
}

void sigmoid_gate(float *x, const float *g, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) x[i] *= sigmoid(g[i]);
}

void mhc_mix(const float *R, const float *hp, const float *y, uint32_t N, uint32_t D, float *X, float *Xs) {
    std::memcpy(Xs, X, sizeof(float) * N * D);  // lanes are mixed from a snapshot
    for (uint32_t k = 0; k < N; ++k) {
        float *dst = X + size_t(k) * D;
        std::fill(dst, dst + D, 0.0f);
        for (uint32_t j = 0; j < N; ++j)
            for (uint32_t c = 0; c < D; ++c) dst[c] += R[k * N + j] * Xs[size_t(j) * D + c];
        for (uint32_t c = 0; c < D; ++c) dst[c] += hp[k] * y[c];
    }
}

// Σ a[d] * b[d] in double with 8 interleaved partial sums (a fixed order, so the same bits for
// every chunking; a single running sum would be latency-bound).
double dot_double(const float *a, const float *b, uint32_t n) {
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (uint32_t j = 0; j < 8; ++j) part[j] += double(a[d + j]) * double(b[d + j]);
    for (; d < n; ++d) part[d % 8] += double(a[d]) * double(b[d]);
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// acc[d] += e * x[d] in double (restrict: the compiler vectorises it).
void axpy_double(double e, const float *__restrict x, double *__restrict acc, uint32_t n) {
    for (uint32_t d = 0; d < n; ++d) acc[d] += e * double(x[d]);
}

void pool_probe(const float *q, const float *cells, size_t cell_stride, const uint32_t *tokens, uint32_t n,
                uint32_t D, double inv_sqrt_d, double *a) {
    for (uint32_t i = 0; i < n; ++i) {
        if (tokens[i] == 0) continue;
        const float *cell = cells + size_t(i) * cell_stride;
        const double z = dot_double(cell, q, D) * inv_sqrt_d;
        if (z > a[0]) {  // new maximum: rescale what is summed so far
            const double r = std::exp(a[0] - z);
            a[1] *= r;
            for (uint32_t d = 0; d < D; ++d) a[2 + d] *= r;
            a[0] = z;
        }
        const double e = std::exp(z - a[0]);
        a[1] += e;
        axpy_double(e, cell, a + 2, D);
    }
}

const KernelTable &table() {
    static const KernelTable t{"scalar", cq_prepare_input, cq_matmul, cq_dequantize_row, fwht,
                               rms_unit, zcrms, rope, attention_group<float>, attention_group<int8_t>, sinkhorn, silu, pool_probe, 0,
                               nullptr, cq_fast_quantize, cq_matmul_fast, sigmoid_gate, mhc_mix};
    return t;
}

}  // namespace scalar
}  // namespace needle
