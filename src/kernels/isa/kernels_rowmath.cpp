// Per-position element-wise kernels of one ISA: the mHC Sinkhorn, SiLU and the Needle 2 probe
// pooling. Compiled once per ISA like kernels_simd.cpp (same NEEDLE_ISA_NS / NEEDLE_XSIMD_ARCH,
// same flags; its table() takes these entries). They do the scalar reference's arithmetic in
// its order; what differs is where the reference calls libm: xsimd's exp and log here (a few
// ulp from libm). Every call handles one position (Sinkhorn, SiLU) or runs the positions in
// order (pooling), so a position gives the same bits in a decode step and in a prefill chunk.
#include <cmath>
#include <cstring>

#include <xsimd/xsimd.hpp>

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "kernels/kernel_table.h"

namespace needle {
namespace NEEDLE_ISA_NS {
namespace {

using Arch = NEEDLE_XSIMD_ARCH;
using Vec = xsimd::batch<float, Arch>;
using DVec = xsimd::batch<double, Arch>;
constexpr uint32_t W = uint32_t(Vec::size);
constexpr uint32_t WD = uint32_t(DVec::size);

// x[0..n) := exp(x) (n rounded up to W: the caller's buffer has room for the lanes past n).
inline void exp_in_place(float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i += W) xsimd::exp(Vec::load_aligned(x + i)).store_aligned(x + i);
}
inline void log_in_place(float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i += W) xsimd::log(Vec::load_aligned(x + i)).store_aligned(x + i);
}

// WD floats at p as doubles (exact). xsimd 8.1 has no widening load: one intrinsic per ISA.
inline DVec load_wide(const float *p) {
#if defined(__AVX512F__)
    return DVec(_mm512_cvtps_pd(_mm256_loadu_ps(p)));
#elif defined(__AVX__)
    return DVec(_mm256_cvtps_pd(_mm_loadu_ps(p)));
#elif defined(__SSE2__)
    // movq through __m128i: p is only float-aligned, so no double load (UB, and UBSan says so).
    return DVec(_mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)))));
#elif defined(__ARM_NEON) && defined(__aarch64__)
    return DVec(vcvt_f64_f32(vld1_f32(p)));
#else
    alignas(64) double t[WD];
    for (uint32_t i = 0; i < WD; ++i) t[i] = double(p[i]);
    return DVec::load_aligned(t);
#endif
}

#if defined(__AVX512F__)
// GCC 12 reports the AVX-512 intrinsics' undefined pass-through operand (`__Y = __Y` in
// avx512fintrin.h, here and inside xsimd's exp/log) as uninitialised once they are inlined
// into sinkhorn4's register arrays: a false positive, silenced for this block only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// The 4 x 4 matrix (mHC's 4 lanes) in one register, lane 4i + j = m[i][j]: a half-round is a
// few in-register broadcasts, one 16-lane exp and one 16-lane log. Rows are 128-bit blocks, so
// row j-th entries are broadcast within blocks (vpermilps), columns' i-th entries across blocks
// (vshuff32x4); the sums run in the reference's order ((x0 + x1) + x2) + x3 (its 0 + x0 is x0).
// xsimd 8.1 has neither in-block nor block shuffles: intrinsics here.
// Entry k of each row (kRows) or row k (columns), broadcast to the lanes that sum over it.
template <bool kRows, int k>
inline __m512 pick(__m512 x) {
    if constexpr (kRows) return _mm512_permute_ps(x, k * 0x55);
    else return _mm512_shuffle_f32x4(x, x, k * 0x55);
}
inline __m512 vmax(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }

template <bool kRows>
inline __m512 sinkhorn4_half(__m512 v) {
    const __m512 mx = vmax(vmax(pick<kRows, 0>(v), pick<kRows, 1>(v)), vmax(pick<kRows, 2>(v), pick<kRows, 3>(v)));
    const __m512 e = xsimd::exp(Vec(_mm512_sub_ps(v, mx)));
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(pick<kRows, 0>(e), pick<kRows, 1>(e)), pick<kRows, 2>(e)),
                                   pick<kRows, 3>(e));
    const __m512 r = _mm512_add_ps(mx, xsimd::log(Vec(s)));
    return _mm512_sub_ps(v, r);
}
#endif

// Log-domain Sinkhorn of one matrix (the scalar table's is the reference): per half-round
// the maxima, differences, sums and subtractions of the reference in its order, the n*n exps
// and the n logs as vectors from a padded copy.
void sinkhorn_one(float *m, uint32_t n) {
    constexpr uint32_t kMax = 64;
    alignas(64) float t[kMax * kMax + 16], mx[kMax + 16], ls[kMax + 16];
    const uint32_t nn = n * n;
    // Lanes past the matrix (past the n sums) hold 0 (1): finite exps and logs, never read.
    for (uint32_t i = nn; i % W; ++i) t[i] = 0.0f;
    for (uint32_t i = n; i % W; ++i) ls[i] = 1.0f;
    for (int it = 0; it < 20; ++it) {
        for (int pass = 0; pass < 2; ++pass) {
            // pass 0: rows (element j of vector i at i*n + j); pass 1: columns (at j*n + i).
            const uint32_t si = pass == 0 ? n : 1, sj = pass == 0 ? 1 : n;
            for (uint32_t i = 0; i < n; ++i) {
                float v = -INFINITY;
                for (uint32_t j = 0; j < n; ++j) v = std::max(v, m[i * si + j * sj]);
                mx[i] = v;
                for (uint32_t j = 0; j < n; ++j) t[i * n + j] = m[i * si + j * sj] - v;
            }
            exp_in_place(t, nn);
            for (uint32_t i = 0; i < n; ++i) {
                float s = 0.0f;
                for (uint32_t j = 0; j < n; ++j) s += t[i * n + j];
                ls[i] = s;
            }
            log_in_place(ls, n);
            for (uint32_t i = 0; i < n; ++i) {
                const float r = mx[i] + ls[i];
                for (uint32_t j = 0; j < n; ++j) m[i * si + j * sj] -= r;
            }
        }
    }
    std::memcpy(t, m, sizeof(float) * nn);
    exp_in_place(t, nn);
    std::memcpy(m, t, sizeof(float) * nn);
}

#if defined(__AVX512F__)
// U 4 x 4 matrices side by side: each half-round is a chain of dependent exp and log (latency
// bound), so independent matrices fill the pipeline. Per matrix the ops of one alone.
template <uint32_t U>
inline void sinkhorn4(float *m) {
    __m512 v[U];
    for (uint32_t u = 0; u < U; ++u) v[u] = _mm512_loadu_ps(m + 16 * u);
    for (int it = 0; it < 20; ++it) {
        for (uint32_t u = 0; u < U; ++u) v[u] = sinkhorn4_half<true>(v[u]);
        for (uint32_t u = 0; u < U; ++u) v[u] = sinkhorn4_half<false>(v[u]);
    }
    for (uint32_t u = 0; u < U; ++u) _mm512_storeu_ps(m + 16 * u, xsimd::exp(Vec(v[u])));
}
#endif

}  // namespace

void sinkhorn(float *m, uint32_t n, uint32_t count) {
    uint32_t k = 0;
#if defined(__AVX512F__)
    if (n == 4) {
        for (; k + 4 <= count; k += 4) sinkhorn4<4>(m + 16 * k);
        for (; k < count; ++k) sinkhorn4<1>(m + 16 * k);
    }
#endif
    for (; k < count; ++k) sinkhorn_one(m + size_t(k) * n * n, n);
}
#if defined(__AVX512F__)
#pragma GCC diagnostic pop
#endif

// y = a * (1 / (1 + exp(-g))) over n floats, W at a time (a tail through a padded copy);
// y may alias a or g.
inline void gated(const float *a, const float *g, uint32_t n, float *y) {
    const Vec one(1.0f);
    uint32_t i = 0;
    for (; i + W <= n; i += W) {
        const Vec v = Vec::load_unaligned(a + i), z = Vec::load_unaligned(g + i);
        (v * (one / (one + xsimd::exp(-z)))).store_unaligned(y + i);
    }
    if (i < n) {
        alignas(64) float ta[W] = {}, tg[W] = {};
        std::memcpy(ta, a + i, sizeof(float) * (n - i));
        std::memcpy(tg, g + i, sizeof(float) * (n - i));
        const Vec v = Vec::load_aligned(ta), z = Vec::load_aligned(tg);
        (v * (one / (one + xsimd::exp(-z)))).store_aligned(ta);
        std::memcpy(y + i, ta, sizeof(float) * (n - i));
    }
}

// y = x * (1 / (1 + exp(-x))) (kernels.h silu); y may alias x.
void silu(const float *x, uint32_t n, float *y) { gated(x, x, n, y); }

// x *= 1 / (1 + exp(-g)) (kernels.h sigmoid_gate): a decode step's 27 x 512 output gates were
// libm expf calls, ~2 % of the calling thread's time on the Sapphire Rapids VM.
void sigmoid_gate(float *x, const float *g, uint32_t n) { gated(x, g, n, x); }

namespace {
// Columns [c, c + W) of every lane, the N <= kMixRegs inputs held in registers (no snapshot).
template <uint32_t N>
inline void mix_columns(const float *R, const float *hp, const float *y, uint32_t D, float *X, uint32_t c) {
    Vec in[N];
    for (uint32_t j = 0; j < N; ++j) in[j] = Vec::load_unaligned(X + size_t(j) * D + c);
    const Vec yv = Vec::load_unaligned(y + c);
    for (uint32_t k = 0; k < N; ++k) {
        Vec acc(0.0f);
        for (uint32_t j = 0; j < N; ++j) acc = acc + Vec(R[k * N + j]) * in[j];
        (acc + Vec(hp[k]) * yv).store_unaligned(X + size_t(k) * D + c);
    }
}
}  // namespace

// kernels.h mhc_mix. Lane counts 1-8 (needle2 and needle3 use 4) keep a column block's inputs in
// registers; other counts, and the columns past the last whole vector, take the scalar steps.
void mhc_mix(const float *R, const float *hp, const float *y, uint32_t N, uint32_t D, float *X, float *Xs) {
    uint32_t c = 0;
    switch (N) {
#define NEEDLE_MIX(n) case n: for (; c + W <= D; c += W) mix_columns<n>(R, hp, y, D, X, c); break
        NEEDLE_MIX(1); NEEDLE_MIX(2); NEEDLE_MIX(3); NEEDLE_MIX(4);
        NEEDLE_MIX(5); NEEDLE_MIX(6); NEEDLE_MIX(7); NEEDLE_MIX(8);
#undef NEEDLE_MIX
    default: break;
    }
    if (c == D) return;
    for (uint32_t j = 0; j < N; ++j) std::memcpy(Xs + size_t(j) * D + c, X + size_t(j) * D + c, sizeof(float) * (D - c));
    for (uint32_t k = 0; k < N; ++k)
        for (uint32_t e = c; e < D; ++e) {
            float acc = 0.0f;
            for (uint32_t j = 0; j < N; ++j) acc += R[k * N + j] * Xs[size_t(j) * D + e];
            X[size_t(k) * D + e] = acc + hp[k] * y[e];
        }
}

namespace {

// Σ a[d] * b[d] in double over 8 interleaved partial sums, part[d % 8], reduced as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)): the reference's order (the float products
// are exact in double, so no rounding depends on how they are formed).
inline double dot_double(const float *a, const float *b, uint32_t n) {
    constexpr uint32_t K = 8 / WD;
    DVec acc[K];
    for (uint32_t k = 0; k < K; ++k) acc[k] = DVec(0.0);
    uint32_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (uint32_t k = 0; k < K; ++k) acc[k] = acc[k] + load_wide(a + d + k * WD) * load_wide(b + d + k * WD);
    alignas(64) double part[8];
    for (uint32_t k = 0; k < K; ++k) acc[k].store_aligned(part + k * WD);
    for (; d < n; ++d) part[d % 8] += double(a[d]) * double(b[d]);
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// acc[0 .. U*WD) over the k kept cells in order: times rv[j] on a rescale (rv[j] == 1.0 is a
// no-op either way), plus ev[j] * cell. U independent accumulators hide the add latency.
template <uint32_t U>
inline void weighted_sums(double *acc, const float *cells, size_t stride, const uint32_t *at, const double *rv,
                          const double *ev, uint32_t k) {
    DVec s[U];
    for (uint32_t u = 0; u < U; ++u) s[u] = DVec::load_unaligned(acc + u * WD);
    for (uint32_t j = 0; j < k; ++j) {
        const float *c = cells + size_t(at[j]) * stride;
        if (rv[j] != 1.0) {
            const DVec r(rv[j]);
            for (uint32_t u = 0; u < U; ++u) s[u] = s[u] * r;
        }
        const DVec e(ev[j]);
        for (uint32_t u = 0; u < U; ++u) s[u] = s[u] + e * load_wide(c + u * WD);
    }
    for (uint32_t u = 0; u < U; ++u) s[u].store_unaligned(acc + u * WD);
}

}  // namespace

// One probe's running softmax pooling over n cells (kernels.h pool_probe). Positions go
// in blocks of up to 64: first the scores and the scalar running max / denominator in order
// (the reference's steps), then the weighted sums with WD accumulators in registers across the
// block's positions, each rescaled and added to in position order as the reference does.
void pool_probe(const float *q, const float *cells, size_t cell_stride, const uint32_t *tokens, uint32_t n,
                uint32_t D, double inv_sqrt_d, double *a) {
    constexpr uint32_t kBlock = 64;
    double ev[kBlock], rv[kBlock];
    uint32_t at[kBlock];
    for (uint32_t i0 = 0; i0 < n; i0 += kBlock) {
        const uint32_t nb = n - i0 < kBlock ? n - i0 : kBlock;
        uint32_t k = 0;
        for (uint32_t i = i0; i < i0 + nb; ++i) {
            if (tokens[i] == 0) continue;  // PAD cells are excluded from the pool
            const double z = dot_double(cells + size_t(i) * cell_stride, q, D) * inv_sqrt_d;
            rv[k] = 1.0;  // no rescale
            if (z > a[0]) {
                rv[k] = std::exp(a[0] - z);
                a[1] *= rv[k];
                a[0] = z;
            }
            ev[k] = std::exp(z - a[0]);
            a[1] += ev[k];
            at[k++] = i;
        }
        double *acc = a + 2;
        uint32_t d = 0;
        for (; d + 4 * WD <= D; d += 4 * WD) weighted_sums<4>(acc + d, cells + d, cell_stride, at, rv, ev, k);
        for (; d + WD <= D; d += WD) weighted_sums<1>(acc + d, cells + d, cell_stride, at, rv, ev, k);
        for (; d < D; ++d)
            for (uint32_t j = 0; j < k; ++j) {
                acc[d] *= rv[j];
                acc[d] += ev[j] * double(cells[size_t(at[j]) * cell_stride + d]);
            }
    }
}

}  // namespace NEEDLE_ISA_NS
}  // namespace needle
