// FAST (int8) CQ kernels (cq_fast.h), compiled once per ISA like kernels_simd.cpp (same
// NEEDLE_ISA_NS / NEEDLE_ISA_NAME / NEEDLE_XSIMD_ARCH; CMakeLists.txt), plus on x86 an AVX-512
// build with VNNI (NEEDLE_I8_VNNI, namespace isa_avx512vnni) that the plain AVX-512 entry calls
// when the CPU has it.
//
// AVX-512 / AVX2 read the rows-in-lanes copy (cq_matrix.h): one 32-bit word per row lane holds
// 16 crumbs or 8 nibbles; a shift and a 0x03 / 0x0F byte mask leave 4 indices, one per byte,
// a byte shuffle turns them into int8 levels, and one dot instruction (vpdpbusd, or vpmaddubsw +
// vpmaddwd) adds 4 products per row lane against the 4 activation bytes broadcast (the input is
// quantised in the matching column order, cq_fast.h). NEON reads the stored form with a table
// lookup (vqtbl1q) and widening multiplies (or sdot where the compiler targets dotprod).
// Integer sums are exact, and the float epilogue is the reference's sequence of operations per
// row, so every path gives the bits of scalar::cq_matmul_fast.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <xsimd/xsimd.hpp>

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "kernels/kernel_table.h"

#if defined(__x86_64__) && defined(__AVX512F__) && !defined(NEEDLE_I8_VNNI) && defined(NEEDLE_HAVE_I8_VNNI)
namespace needle {
namespace isa_avx512vnni {
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride);
}
}  // namespace needle
#endif

namespace needle {
namespace NEEDLE_ISA_NS {

#if !defined(NEEDLE_I8_VNNI)
// Same arithmetic as scalar::cq_fast_quantize: xsimd's nearbyint_as_int rounds to nearest even
// like std::nearbyint; clamping the int equals clamping the float (both bound by +-127).
void cq_fast_quantize(const float *xh, size_t xh_stride, size_t n_pos, uint32_t cols_pad, uint32_t group,
                      int8_t *q2, size_t q2_stride, int8_t *q4, size_t q4_stride, float *scale, int32_t *sum) {
    using Vf = xsimd::batch<float, NEEDLE_XSIMD_ARCH>;
    using Vi = xsimd::batch<int32_t, NEEDLE_XSIMD_ARCH>;
    constexpr uint32_t W = uint32_t(Vf::size);
    if (group % W) {
        scalar::cq_fast_quantize(xh, xh_stride, n_pos, cols_pad, group, q2, q2_stride, q4, q4_stride, scale, sum);
        return;
    }
    const uint32_t ng = cols_pad / group, gb2 = cq_fast_group_bytes(group, 2), gb4 = cq_fast_group_bytes(group, 4);
    alignas(64) int32_t qi[4096];
    alignas(64) float mx[W];
    for (size_t p = 0; p < n_pos; ++p)
        for (uint32_t g = 0; g < ng; ++g) {
            const float *x = xh + p * xh_stride + size_t(g) * group;
            Vf m(0.0f);
            for (uint32_t k = 0; k < group; k += W) m = xsimd::max(m, xsimd::abs(Vf::load_unaligned(x + k)));
            m.store_aligned(mx);
            float amax = 0.0f;
            for (uint32_t i = 0; i < W; ++i) amax = mx[i] > amax ? mx[i] : amax;
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            const Vf vinv(inv);
            const Vi lo(-127), hi(127);
            Vi vs(0);
            for (uint32_t k = 0; k < group; k += W) {
                const Vi q = xsimd::min(hi, xsimd::max(lo, xsimd::nearbyint_as_int(Vf::load_unaligned(x + k) * vinv)));
                vs += q;
                q.store_aligned(qi + k);
            }
            int32_t s = 0;
            alignas(64) int32_t t[W];
            vs.store_aligned(t);
            for (uint32_t i = 0; i < W; ++i) s += t[i];
#if defined(__SSSE3__)
            if (group % 16 == 0) {  // 16 columns at a time: pack to bytes, one byte shuffle per layout
                const __m128i i2 = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                const __m128i i4 = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
                int8_t *d2 = q2 ? q2 + p * q2_stride + size_t(g) * gb2 : nullptr;
                int8_t *d4 = q4 ? q4 + p * q4_stride + size_t(g) * gb4 : nullptr;
                for (uint32_t k = 0; k < group; k += 16) {
                    const __m128i *src = reinterpret_cast<const __m128i *>(qi + k);
                    const __m128i b = _mm_packs_epi16(_mm_packs_epi32(_mm_load_si128(src), _mm_load_si128(src + 1)),
                                                      _mm_packs_epi32(_mm_load_si128(src + 2), _mm_load_si128(src + 3)));
                    if (d2) _mm_storeu_si128(reinterpret_cast<__m128i *>(d2 + k), _mm_shuffle_epi8(b, i2));
                    if (d4) _mm_storeu_si128(reinterpret_cast<__m128i *>(d4 + k), _mm_shuffle_epi8(b, i4));
                }
                scale[p * ng + g] = amax / 127.0f;
                sum[p * ng + g] = s;
                continue;
            }
#endif
            if (q2) {  // a 4 x 4 byte transpose per chunk of 16 columns
                int8_t *d = q2 + p * q2_stride + size_t(g) * gb2;
                std::memset(d, 0, gb2);
                for (uint32_t k = 0; k < group; ++k) d[cq_fast_pos(k, 2)] = int8_t(qi[k]);
            }
            if (q4) {
                int8_t *d = q4 + p * q4_stride + size_t(g) * gb4;
                std::memset(d, 0, gb4);
                for (uint32_t k = 0; k < group; ++k) d[cq_fast_pos(k, 4)] = int8_t(qi[k]);
            }
            scale[p * ng + g] = amax / 127.0f;
            sum[p * ng + g] = s;
        }
}
#endif

#if defined(__AVX2__)
namespace {
#include "kernels/isa/i8_lanes.h"

inline int32_t load4(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// P positions of one row block over all groups: tot[p] (one float per row lane).
// FW = field bits of the copy (2: crumbs, 4: nibbles), NA = accumulators per position.
template <uint32_t FW, uint32_t P, uint32_t NA>
inline void block_pass(const CqMatrix &w, const i8::Book &bk, const uint8_t *rec0, const int8_t *q, size_t qs,
                       const float *scale, const int32_t *sum, uint32_t ngs, i8::F *tot) {
    using namespace i8;
    constexpr uint32_t SH = FW == 2 ? 4 : 2;  // index fields per byte of a word
    const I m = mask(FW == 2 ? 0x03030303u : 0x0F0F0F0Fu);
    const uint32_t words = cq_block_words(w), gb = cq_fast_group_bytes(w.group, FW);
    const size_t rec_bytes = cq_block_record_bytes(w);
    const uint8_t *rec = rec0;
    // A decode step (P == 1) reads each weight once, mostly from L3: fetch the same record of the
    // next row block meanwhile, one line per line read (as the exact kernels do; Sapphire Rapids
    // VM, FAST decode 1.08x; four blocks ahead was slower).
    const size_t ahead = size_t(w.ngroups) * rec_bytes;
    for (uint32_t g = 0; g < w.ngroups; ++g, rec += rec_bytes) {
        const uint32_t *wd = reinterpret_cast<const uint32_t *>(rec + 4 * RB);
        if (P == 1) __builtin_prefetch(rec + ahead, 0, 3);
        const int8_t *xg = q + size_t(g) * gb;
        I a[P][NA];
        for (uint32_t p = 0; p < P; ++p)
            for (uint32_t i = 0; i < NA; ++i) a[p][i] = zero();
        for (uint32_t j = 0; j < words; ++j) {
            if (P == 1) __builtin_prefetch(reinterpret_cast<const char *>(wd + size_t(j) * RB) + ahead, 0, 3);
            const I v = load_words(wd + size_t(j) * RB);
#pragma GCC unroll 4
            for (uint32_t s = 0; s < SH; ++s) {
                I idx;
                switch (s) {  // constant after unrolling
                case 0: idx = srl_and<0>(v, m); break;
                case 1: idx = srl_and<FW>(v, m); break;
                case 2: idx = srl_and<2 * FW>(v, m); break;
                default: idx = srl_and<3 * FW>(v, m); break;
                }
                const I wv = bk(idx);
                // Word j covers chunk j (layout 2: 16 columns = 16 bytes) or chunk j (layout 4:
                // 8 columns = 8 bytes); shift s meets bytes 4s .. 4s+3 of the chunk.
                const size_t off = size_t(j) * (FW == 2 ? 16 : 8) + 4 * s;
#pragma GCC unroll 4
                for (uint32_t p = 0; p < P; ++p) a[p][s % NA] = dot(a[p][s % NA], wv, load4(xg + p * qs + off));
            }
        }
        const F nv = fload(reinterpret_cast<const float *>(rec));
        for (uint32_t p = 0; p < P; ++p) {
            I t = a[p][0];
            for (uint32_t i = 1; i < NA; ++i) t = add(t, a[p][i]);
            if (kUnsignedBook) t = sub(t, bcast(128 * sum[p * ngs + g]));
            tot[p] = fadd(tot[p], fmul(cvt(t), fmul(nv, fbcast(scale[p * ngs + g]))));
        }
    }
}

template <uint32_t FW>
void lanes_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                size_t y_stride) {
    using namespace i8;
    const CqFastBook fb(w);
    const Book bk(fb.wq);
    const int8_t *q = FW == 2 ? x.q2 : x.q4;
    const size_t qs = FW == 2 ? x.q2_stride : x.q4_stride;
    const size_t rec_bytes = cq_block_record_bytes(w);
    const F bs = fbcast(fb.scale);
    alignas(64) float out[RB];
    for (uint32_t b = r0 / RB; b * RB < r0 + count; ++b) {
        const uint32_t lo = b * RB > r0 ? b * RB : r0, hi = (b + 1) * RB < r0 + count ? (b + 1) * RB : r0 + count;
        const uint8_t *rec0 = w.blocked + size_t(b) * w.ngroups * rec_bytes;
        size_t p = 0;
        auto emit = [&](F t, size_t pp) {
            fstore(out, fmul(t, bs));
            for (uint32_t r = lo; r < hi; ++r) y[pp * y_stride + (r - r0)] = out[r - b * RB];
        };
        if (n_pos == 1) {
            F t = fzero();
            block_pass<FW, 1, 4>(w, bk, rec0, q, qs, x.scale, x.sum, x.ngroups, &t);
            emit(t, 0);
            continue;
        }
        for (; p + kPos <= n_pos; p += kPos) {
            F t[kPos];
            for (auto &e : t) e = fzero();
            block_pass<FW, kPos, 2>(w, bk, rec0, q + p * qs, qs, x.scale + p * x.ngroups, x.sum + p * x.ngroups,
                                    x.ngroups, t);
            for (uint32_t i = 0; i < kPos; ++i) emit(t[i], p + i);
        }
        for (; p < n_pos; ++p) {
            F t = fzero();
            block_pass<FW, 1, 4>(w, bk, rec0, q + p * qs, qs, x.scale + p * x.ngroups, x.sum + p * x.ngroups,
                                 x.ngroups, &t);
            emit(t, p);
        }
    }
}
}  // namespace

#if defined(NEEDLE_I8_VNNI)
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride) {
    if (w.width == 2) lanes_fast<2>(w, x, n_pos, r0, count, y, y_stride);
    else lanes_fast<4>(w, x, n_pos, r0, count, y, y_stride);
}
#else
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride) {
    if (!w.blocked || w.block_rows != i8::RB) {
        scalar::cq_matmul_fast(w, x, n_pos, r0, count, y, y_stride);
        return;
    }
#if defined(__AVX512F__) && defined(NEEDLE_HAVE_I8_VNNI)
    static const bool vnni = __builtin_cpu_supports("avx512vnni") && !std::getenv("NEEDLE_FAST_NO_VNNI");
    if (vnni) {
        isa_avx512vnni::cq_matmul_fast(w, x, n_pos, r0, count, y, y_stride);
        return;
    }
#endif
    if (w.width == 2) lanes_fast<2>(w, x, n_pos, r0, count, y, y_stride);
    else lanes_fast<4>(w, x, n_pos, r0, count, y, y_stride);
}
#endif

#elif (defined(__ARM_NEON) || defined(__SSSE3__)) && !defined(NEEDLE_I8_VNNI)
namespace {
// The stored form, row by row (NEON; SSE4.2, which has no rows-in-lanes copy). 2-bit: 16 packed
// bytes are 64 columns, and crumb plane s (shift 2s) holds columns 4b + s, which in layout 2 are
// dword s of each of the 4 chunks. 4-bit: 16 bytes are 32 columns, and nibble plane s holds
// columns 2b + s = dword s of each of the 4 chunks of layout 4. group_dot is the ISA part: the
// integer dot of one row's group (whole spans) with its quantised activations.
#if defined(__ARM_NEON)
// Dot of 16 int8 weights with 16 int8 activations, added into acc (4 int32 lanes).
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// The planes' activations gathered by vld4q_s32 (2-bit) or vld2q_s32 (4-bit).
inline int32_t group_dot(const uint8_t *src, const int8_t *xg, const int8_t *wq, uint32_t width, uint32_t group) {
    const int8x16_t book = vld1q_s8(wq);
    const uint32_t span = width == 2 ? 64u : 32u;
    int32x4_t a = vdupq_n_s32(0);
    for (uint32_t c = 0; c < group; c += span, src += 16, xg += span) {
        const uint8x16_t v = vld1q_u8(src);
        if (width == 2) {
            const int32x4x4_t xs = vld4q_s32(reinterpret_cast<const int32_t *>(xg));
            const uint8x16_t m = vdupq_n_u8(3);
            a = dot16(a, vqtbl1q_s8(book, vandq_u8(v, m)), vreinterpretq_s8_s32(xs.val[0]));
            a = dot16(a, vqtbl1q_s8(book, vandq_u8(vshrq_n_u8(v, 2), m)), vreinterpretq_s8_s32(xs.val[1]));
            a = dot16(a, vqtbl1q_s8(book, vandq_u8(vshrq_n_u8(v, 4), m)), vreinterpretq_s8_s32(xs.val[2]));
            a = dot16(a, vqtbl1q_s8(book, vshrq_n_u8(v, 6)), vreinterpretq_s8_s32(xs.val[3]));
        } else {
            const int32x4x2_t xs = vld2q_s32(reinterpret_cast<const int32_t *>(xg));
            a = dot16(a, vqtbl1q_s8(book, vandq_u8(v, vdupq_n_u8(15))), vreinterpretq_s8_s32(xs.val[0]));
            a = dot16(a, vqtbl1q_s8(book, vshrq_n_u8(v, 4)), vreinterpretq_s8_s32(xs.val[1]));
        }
    }
    return vaddvq_s32(a);
}
#else
// acc += 16 int8 weights w times 16 int8 activations x: pmaddubsw takes |w| (u8) times x with
// w's sign (pairs <= 2 * 127^2, no saturation), pmaddwd by ones widens to 4 int32.
inline __m128i dot16(__m128i acc, __m128i w, __m128i x) {
    const __m128i p16 = _mm_maddubs_epi16(_mm_abs_epi8(w), _mm_sign_epi8(x, w));
    return _mm_add_epi32(acc, _mm_madd_epi16(p16, _mm_set1_epi16(1)));
}
inline __m128i lds(const int8_t *p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }

// The planes' activations: a 4 x 4 dword transpose of the 4 chunks (2-bit), the even and odd
// dwords of 2 x 4 (4-bit). pshufb reads the low 4 bits of each index byte (bit 7 is clear).
inline int32_t group_dot(const uint8_t *src, const int8_t *xg, const int8_t *wq, uint32_t width, uint32_t group) {
    const __m128i book = _mm_loadu_si128(reinterpret_cast<const __m128i *>(wq));
    const uint32_t span = width == 2 ? 64u : 32u;
    __m128i a = _mm_setzero_si128();
    for (uint32_t c = 0; c < group; c += span, src += 16, xg += span) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src));
        if (width == 2) {
            const __m128i m = _mm_set1_epi8(3);
            const __m128i x0 = lds(xg), x1 = lds(xg + 16), x2 = lds(xg + 32), x3 = lds(xg + 48);
            const __m128i t0 = _mm_unpacklo_epi32(x0, x1), t1 = _mm_unpacklo_epi32(x2, x3);
            const __m128i t2 = _mm_unpackhi_epi32(x0, x1), t3 = _mm_unpackhi_epi32(x2, x3);
            const __m128i p0 = _mm_unpacklo_epi64(t0, t1), p1 = _mm_unpackhi_epi64(t0, t1);
            const __m128i p2 = _mm_unpacklo_epi64(t2, t3), p3 = _mm_unpackhi_epi64(t2, t3);
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(v, m)), p0);
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(v, 2), m)), p1);
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(v, 4), m)), p2);
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(v, 6), m)), p3);
        } else {
            const __m128 x0 = _mm_castsi128_ps(lds(xg)), x1 = _mm_castsi128_ps(lds(xg + 16));
            const __m128i m = _mm_set1_epi8(15);
            const __m128i p0 = _mm_castps_si128(_mm_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)));
            const __m128i p1 = _mm_castps_si128(_mm_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(v, m)), p0);
            a = dot16(a, _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(v, 4), m)), p1);
        }
    }
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 3, 2)));
    a = _mm_add_epi32(a, _mm_shuffle_epi32(a, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(a);
}
#endif
}  // namespace

// Width 3 (and any group that is not whole spans) takes the reference.
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride) {
    const uint32_t span = w.width == 2 ? 64u : 32u;
    if (w.width == 3 || w.group % span) {
        scalar::cq_matmul_fast(w, x, n_pos, r0, count, y, y_stride);
        return;
    }
    const CqFastBook fb(w);
    const int8_t *q = w.width == 2 ? x.q2 : x.q4;
    const size_t qs = w.width == 2 ? x.q2_stride : x.q4_stride;
    const uint32_t gbytes = w.group * w.width / 8, gb = cq_fast_group_bytes(w.group, w.width == 2 ? 2 : 4);
    for (size_t p = 0; p < n_pos; ++p)
        for (uint32_t r = r0; r < r0 + count; ++r) {
            const uint8_t *row = w.packed + size_t(r) * w.row_bytes;
            float acc = 0.0f;
            for (uint32_t g = 0; g < w.ngroups; ++g) {
                const int32_t isum = group_dot(row + size_t(g) * gbytes, q + p * qs + size_t(g) * gb, fb.wq, w.width, w.group);
                const float t = w.norms[size_t(r) * w.ngroups + g] * x.scale[p * x.ngroups + g];
                acc = acc + float(isum) * t;
            }
            y[p * y_stride + (r - r0)] = acc * fb.scale;
        }
}
#elif !defined(NEEDLE_I8_VNNI)
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride) {
    scalar::cq_matmul_fast(w, x, n_pos, r0, count, y, y_stride);
}
#endif

}  // namespace NEEDLE_ISA_NS
}  // namespace needle
