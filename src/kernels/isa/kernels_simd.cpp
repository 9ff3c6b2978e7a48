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

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif
// The AVX2 build (8-float vectors) decodes indices straight into registers and runs the first
// FWHT stages in-register; wider or narrower builds take the portable paths.
#if defined(__AVX2__) && !defined(__AVX512F__)
#define NEEDLE_FUSED_DECODE 1
#endif

#include "kernels/kernel_table.h"

namespace needle {
namespace NEEDLE_ISA_NS {
namespace {

using Arch = NEEDLE_XSIMD_ARCH;
using Vec = xsimd::batch<float, Arch>;
constexpr uint32_t W = uint32_t(Vec::size);

inline Vec load(const float *p) { return Vec::load_unaligned(p); }

// a * b + c fused. xsimd 8.1 has no AVX-512 fma: its generic a * b + c is a multiply and an
// add under -ffp-contract=off (two roundings, two instructions).
inline Vec vfma(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
    return Vec(_mm512_fmadd_ps(a, b, c));
#else
    return xsimd::fma(a, b, c);
#endif
}

// W int8 values as floats (exact): sign-extend to 32 bits, convert (xsimd 8.1 has no such load).
inline Vec load(const int8_t *p) {
#if defined(__AVX512F__)
    return Vec(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)))));
#elif defined(__AVX2__)
    return Vec(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p)))));
#elif defined(__SSE4_1__)
    int32_t four;
    std::memcpy(&four, p, 4);
    return Vec(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))));
#elif defined(__ARM_NEON)
    // Exactly W = 4 bytes: vld1_s8 would read 8, past the end of the last row of a KV ring.
    int32_t four;
    std::memcpy(&four, p, 4);
    const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four)));
    return Vec(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))));
#else
    alignas(64) float t[W];
    for (uint32_t i = 0; i < W; ++i) t[i] = float(p[i]);
    return Vec::load_aligned(t);
#endif
}

// sum a[k]*b[k]: four W-wide accumulators over blocks of 4W, then W-wide steps, then a tail.
// b is float, or an int8 KV row.
template <class T>
inline float dot(const float *a, const T *b, uint32_t n) {
    Vec acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
    uint32_t k = 0;
    for (; k + 4 * W <= n; k += 4 * W) {
        acc0 = vfma(load(a + k), load(b + k), acc0);
        acc1 = vfma(load(a + k + W), load(b + k + W), acc1);
        acc2 = vfma(load(a + k + 2 * W), load(b + k + 2 * W), acc2);
        acc3 = vfma(load(a + k + 3 * W), load(b + k + 3 * W), acc3);
    }
    for (; k + W <= n; k += W) acc0 = vfma(load(a + k), load(b + k), acc0);
    float s = xsimd::hadd((acc0 + acc1) + (acc2 + acc3));
    for (; k < n; ++k) s += a[k] * float(b[k]);
    return s;
}

// y[i] += s * x[i]; x is float, or an int8 KV row.
template <class T>
inline void axpy(float s, const T *x, float *y, uint32_t n) {
    const Vec vs(s);
    uint32_t k = 0;
    for (; k + W <= n; k += W) vfma(vs, load(x + k), load(y + k)).store_unaligned(y + k);
    for (; k < n; ++k) y[k] += s * float(x[k]);
}

inline void scale(float *x, float s, uint32_t n) {
    const Vec vs(s);
    uint32_t k = 0;
    for (; k + W <= n; k += W) (load(x + k) * vs).store_unaligned(x + k);
    for (; k < n; ++k) x[k] *= s;
}

// ---------------------------------------------------------------- CQ group decode (§8)

#if defined(__AVX2__)
// AVX2: 8 indices at a time, without tables in memory. The indices are shifted into the eight
// 32-bit lanes and select levels with a lane permute (which reads the low 3 bits only, so the
// 4-entry books are stored twice).
struct Levels {
    __m256 lo, hi;  // 2-bit/ternary: book twice in lo; 3-bit: book in lo; 4-bit: lo/hi halves
    explicit Levels(const CqMatrix &w) {
        if (w.width == 2) {
            lo = _mm256_setr_ps(w.levels[0], w.levels[1], w.levels[2], w.levels[3], w.levels[0],
                                w.levels[1], w.levels[2], w.levels[3]);
            hi = lo;
        } else {
            lo = _mm256_loadu_ps(w.levels);
            hi = w.width == 4 ? _mm256_loadu_ps(w.levels + 8) : lo;
        }
    }
};

// Levels of indices 8b .. 8b+7 of a group whose packed bytes start at `src` (8 indices take
// `Width` bytes, little-endian).
template <uint32_t Width>
inline __m256 decode8(const Levels &lv, const uint8_t *src, uint32_t b) {
    const uint8_t *p = src + b * Width;
    uint32_t bits;
    if (Width == 2) bits = uint32_t(p[0]) | uint32_t(p[1]) << 8;
    else if (Width == 3) bits = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
    else std::memcpy(&bits, p, 4);
    const __m256i v = _mm256_set1_epi32(int(bits));
    if (Width == 2)
        return _mm256_permutevar8x32_ps(lv.lo, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)));
    if (Width == 3)
        return _mm256_permutevar8x32_ps(lv.lo, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)));
    const __m256i idx = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256 a = _mm256_permutevar8x32_ps(lv.lo, idx), c = _mm256_permutevar8x32_ps(lv.hi, idx);
    return _mm256_blendv_ps(a, c, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 picks hi
}

template <uint32_t Width>
void decode_group_w(const Levels &lv, const uint8_t *src, uint32_t group, float *out) {
    for (uint32_t b = 0; b < group / 8; ++b) _mm256_storeu_ps(out + 8 * b, decode8<Width>(lv, src, b));
}

void decode_group(const CqMatrix &w, const Levels &lv, uint32_t r, uint32_t g, float *out) {
    const uint8_t *src = w.packed + size_t(r) * w.row_bytes + size_t(g) * (w.group * w.width / 8);
    switch (w.width) {
    case 2: decode_group_w<2>(lv, src, w.group, out); break;
    case 3: decode_group_w<3>(lv, src, w.group, out); break;
    default: decode_group_w<4>(lv, src, w.group, out); break;
    }
}
#else
struct Levels {
    explicit Levels(const CqMatrix &) {}
};

// Byte lookup tables for widths 2 (and ternary) and 4, 24-bit loads for width 3.
void decode_group(const CqMatrix &w, const Levels &, uint32_t r, uint32_t g, float *out) {
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
#endif

// ---------------------------------------------------------------- group dots for up to 4 rows
//
// The arithmetic of one row is fixed: inside a group two accumulators take alternate W-wide
// blocks (a scalar sum takes a tail shorter than W); the group's vector a0 + a1 is scaled by the
// group norm into a per-row vector accumulator, groups in increasing order; one horizontal sum
// at the end. dot_rows and the fused single-position path both follow it for R <= 4 rows
// sharing one activation, so row blocking, position tiling and the thread split never change
// a bit (cq-kernels.md §7.1, §9).
constexpr uint32_t kRowBlock = 4;
constexpr uint32_t kPosTile = 32;

struct RowAcc {  // one row's running sum for one position
    Vec v;
    float tail;
};

template <uint32_t R>
inline void dot_rows_t(const float *const *u, const float *x, uint32_t n, const float *nrm, RowAcc *acc) {
    Vec a0[R], a1[R];
    for (uint32_t j = 0; j < R; ++j) a0[j] = Vec(0.0f), a1[j] = Vec(0.0f);
    uint32_t k = 0;
    for (; k + 2 * W <= n; k += 2 * W) {
        const Vec x0 = load(x + k), x1 = load(x + k + W);
        for (uint32_t j = 0; j < R; ++j) {
            a0[j] = vfma(load(u[j] + k), x0, a0[j]);
            a1[j] = vfma(load(u[j] + k + W), x1, a1[j]);
        }
    }
    if (k + W <= n) {
        const Vec x0 = load(x + k);
        for (uint32_t j = 0; j < R; ++j) a0[j] = vfma(load(u[j] + k), x0, a0[j]);
        k += W;
    }
    for (uint32_t j = 0; j < R; ++j) {
        acc[j].v = vfma(Vec(nrm[j]), a0[j] + a1[j], acc[j].v);
        if (k < n) {
            float t = 0.0f;
            for (uint32_t i = k; i < n; ++i) t += u[j][i] * x[i];
            acc[j].tail += nrm[j] * t;
        }
    }
}

inline void dot_rows(const float *const *u, uint32_t rows, const float *x, uint32_t n, const float *nrm, RowAcc *acc) {
    switch (rows) {
    case 4: dot_rows_t<4>(u, x, n, nrm, acc); break;
    case 3: dot_rows_t<3>(u, x, n, nrm, acc); break;
    case 2: dot_rows_t<2>(u, x, n, nrm, acc); break;
    default: dot_rows_t<1>(u, x, n, nrm, acc); break;
    }
}

inline float finish(const RowAcc &a) { return xsimd::hadd(a.v) + a.tail; }

#if defined(NEEDLE_FUSED_DECODE)
// Decode-step fast path (one position): the same per-row FMA sequence as dot_rows_t, with each
// weight block decoded straight into a register instead of through the scratch group. Requires
// W == 8 (one decode8 block per vector), i.e. the AVX2 build.
// Levels of the 16 indices starting at packed byte `p` (2 vectors). For 2-bit one 32-bit load
// serves both vectors.
template <uint32_t Width>
inline void decode16(const Levels &lv, const uint8_t *p, __m256 &w0, __m256 &w1) {
    if (Width == 2) {
        uint32_t bits;
        std::memcpy(&bits, p, 4);
        const __m256i v = _mm256_set1_epi32(int(bits));
        w0 = _mm256_permutevar8x32_ps(lv.lo, _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)));
        w1 = _mm256_permutevar8x32_ps(lv.lo, _mm256_srlv_epi32(v, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)));
    } else {
        w0 = decode8<Width>(lv, p, 0);
        w1 = decode8<Width>(lv, p, 1);
    }
}

template <uint32_t R, uint32_t Width>
inline void fused_rows_t(const Levels &lv, const uint8_t *const *src, const float *x, uint32_t n, const float *nrm,
                         RowAcc *acc) {
    Vec a0[R], a1[R];
    for (uint32_t j = 0; j < R; ++j) a0[j] = Vec(0.0f), a1[j] = Vec(0.0f);
    uint32_t k = 0;
    for (; k + 2 * W <= n; k += 2 * W) {
        const Vec x0 = load(x + k), x1 = load(x + k + W);
        for (uint32_t j = 0; j < R; ++j) {
            __m256 w0, w1;
            decode16<Width>(lv, src[j] + k / 8 * Width, w0, w1);
            a0[j] = vfma(Vec(w0), x0, a0[j]);
            a1[j] = vfma(Vec(w1), x1, a1[j]);
        }
    }
    if (k + W <= n) {
        const Vec x0 = load(x + k);
        for (uint32_t j = 0; j < R; ++j) a0[j] = vfma(Vec(decode8<Width>(lv, src[j], k / 8)), x0, a0[j]);
    }
    for (uint32_t j = 0; j < R; ++j) acc[j].v = vfma(Vec(nrm[j]), a0[j] + a1[j], acc[j].v);  // no tail: W == 8
}

template <uint32_t Width>
void fused_rows_w(const Levels &lv, const uint8_t *const *src, uint32_t rows, const float *x, uint32_t n,
                  const float *nrm, RowAcc *acc) {
    switch (rows) {
    case 4: fused_rows_t<4, Width>(lv, src, x, n, nrm, acc); break;
    case 3: fused_rows_t<3, Width>(lv, src, x, n, nrm, acc); break;
    case 2: fused_rows_t<2, Width>(lv, src, x, n, nrm, acc); break;
    default: fused_rows_t<1, Width>(lv, src, x, n, nrm, acc); break;
    }
}

// One position: y[r - r0] for the row block, decode fused into the dot.
void cq_matvec_fused(const CqMatrix &w, const Levels &lv, const float *xh, uint32_t rb, uint32_t R, float *yb) {
    const uint32_t gbytes = w.group * w.width / 8;
    RowAcc acc[kRowBlock];
    for (uint32_t j = 0; j < R; ++j) acc[j] = {Vec(0.0f), 0.0f};
    for (uint32_t g = 0; g < w.ngroups; ++g) {
        const uint8_t *src[kRowBlock];
        float nrm[kRowBlock];
        for (uint32_t j = 0; j < R; ++j) {
            src[j] = w.packed + size_t(rb + j) * w.row_bytes + size_t(g) * gbytes;
            nrm[j] = w.norms[size_t(rb + j) * w.ngroups + g];
        }
        const float *xg = xh + size_t(g) * w.group;
        switch (w.width) {
        case 2: fused_rows_w<2>(lv, src, R, xg, w.group, nrm, acc); break;
        case 3: fused_rows_w<3>(lv, src, R, xg, w.group, nrm, acc); break;
        default: fused_rows_w<4>(lv, src, R, xg, w.group, nrm, acc); break;
        }
    }
    for (uint32_t j = 0; j < R; ++j) yb[j] = finish(acc[j]);
}
#endif

#if defined(__AVX2__)
// ---------------------------------------------------------------- rows-in-lanes CQ kernels
//
// A matrix with a rows-in-lanes copy (cq_matrix.h, made at load by cq_block_matrices) is read
// RB rows at a time, one row per lane: one index word per lane holds 16 (2-bit) or 8 (nibble)
// columns of its row; a shift and a lane permute against the book give the weights of column
// k for all RB rows, and one FMA with the broadcast activation x[k] does RB multiply-adds.
// The order of one row is fixed: column k of a group goes to accumulator k % kAcc (lanes.h),
// summed pairwise (tree), multiplied by the group norm into the row's total, groups in
// increasing order. One loop (lanes_matvec) serves a decode step (several row blocks side by
// side) and a prefill chunk (several positions at a time) alike, so no bit depends on n_pos,
// the row range or threading.
#include "kernels/isa/lanes.h"

// The accumulators of one group summed pairwise: (a0+a1) [+ (a2+a3)] [+ ((a4+a5)+(a6+a7))].
inline lanes::F tree(const lanes::F *a) {
    using namespace lanes;
    if (kAcc == 2) return add(a[0], a[1]);
    const F lo = add(add(a[0], a[1]), add(a[2], a[3]));
    return kAcc == 8 ? add(lo, add(add(a[4], a[5]), add(a[6], a[7]))) : lo;
}

// Eight columns of one word (fields `first` .. first+7) into the accumulators of P positions
// (inputs x[p]): each decoded weight vector feeds P FMAs.
template <uint32_t FW, bool Wide, uint32_t P>
inline lanes::I lanes_step8(const lanes::Book &bk, lanes::I v, const float *const *x, lanes::F (*a)[lanes::kAcc]) {
    using namespace lanes;
    if (FW == 2 && kFieldPairs) {  // columns c, c + 1 from one shift (lanes.h Book::second)
#pragma GCC unroll 4
        for (uint32_t c = 0; c < 8; c += 2) {
            const F w0 = bk.operator()<Wide>(v), w1 = bk.second(v);
            for (uint32_t p = 0; p < P; ++p) {
                a[p][c % kAcc] = fma(w0, bcast(x[p][c]), a[p][c % kAcc]);
                a[p][(c + 1) % kAcc] = fma(w1, bcast(x[p][c + 1]), a[p][(c + 1) % kAcc]);
            }
            v = srl<4>(v);
        }
        return v;
    }
#pragma GCC unroll 8
    for (uint32_t c = 0; c < 8; ++c) {
        const F wc = bk.operator()<Wide>(v);
        for (uint32_t p = 0; p < P; ++p) a[p][c % kAcc] = fma(wc, bcast(x[p][c]), a[p][c % kAcc]);
        v = srl<FW>(v);
    }
    return v;
}

// P positions (xh + p * xs) against NB consecutive row blocks (block i's records from
// rec + i * blk_bytes), the weights decoded in registers: tot[i][p] = the RB row totals of block
// i at position p. Blocks side by side only add independent chains: each row's order is the
// same for every P and NB.
template <uint32_t FW, bool Wide, uint32_t P, uint32_t NB>
inline void lanes_matvec(const CqMatrix &w, const lanes::Book &bk, const uint8_t *rec, size_t blk_bytes,
                         const float *xh, size_t xs, lanes::F (*tot)[P]) {
    using namespace lanes;
    constexpr uint32_t CPW = 32 / FW;
    const uint32_t full = w.group / CPW;  // whole words; a 2-bit group of 16n+8 has a half word
    const size_t rec_bytes = cq_block_record_bytes(w);
    for (uint32_t i = 0; i < NB; ++i)
        for (uint32_t p = 0; p < P; ++p) tot[i][p] = zero();
    for (uint32_t g = 0; g < w.ngroups; ++g, rec += rec_bytes) {
        const float *x[P];
        for (uint32_t p = 0; p < P; ++p) x[p] = xh + p * xs + size_t(g) * w.group;
        const uint32_t *wd[NB];
        for (uint32_t i = 0; i < NB; ++i) wd[i] = reinterpret_cast<const uint32_t *>(rec + i * blk_bytes + 4 * RB);
        // A decode step reads each weight once, from L3 as a rule (needle2's copies are 10.9 MB,
        // L2 2 MB), and perf showed the word loads stalling: fetch the same record of the next
        // pass's blocks (NB blocks on) meanwhile, one line per line read. A prefetch never
        // faults, so the last pass may reach past the copy. (Sapphire Rapids VM: decode 1.04x;
        // two passes ahead or half a pass no better; a prefill chunk, which reads each block for
        // several passes, gained nothing from prefetching the next block.)
        if (NB > 1)
            for (uint32_t i = 0; i < NB; ++i) __builtin_prefetch(rec + (i + NB) * blk_bytes, 0, 3);
        F a[NB][P][kAcc];
        for (auto &ai : a)
            for (auto &ap : ai)
                for (auto &e : ap) e = zero();
        for (uint32_t j = 0; j < full; ++j) {
            I v[NB];
            for (uint32_t i = 0; i < NB; ++i) {
                if (NB > 1) __builtin_prefetch(reinterpret_cast<const char *>(wd[i] + size_t(j) * RB) + NB * blk_bytes, 0, 3);
                v[i] = lanes_step8<FW, Wide, P>(bk, load_words(wd[i] + size_t(j) * RB), x, a[i]);
            }
            for (uint32_t p = 0; p < P; ++p) x[p] += 8;
            if (CPW == 16) {
                for (uint32_t i = 0; i < NB; ++i) lanes_step8<FW, Wide, P>(bk, v[i], x, a[i]);
                for (uint32_t p = 0; p < P; ++p) x[p] += 8;
            }
        }
        if (full * CPW < w.group)
            for (uint32_t i = 0; i < NB; ++i) lanes_step8<FW, Wide, P>(bk, load_words(wd[i] + size_t(full) * RB), x, a[i]);
        for (uint32_t i = 0; i < NB; ++i) {
            const F nv = lanes::load(reinterpret_cast<const float *>(rec + i * blk_bytes));
            for (uint32_t p = 0; p < P; ++p) tot[i][p] = lanes::fma(nv, tree(a[i][p]), tot[i][p]);
        }
    }
}

// Rows [lo, hi) of block b's totals (lanes lo - b*RB ..) into y (row lo at y[0]).
inline void lanes_store(lanes::F tot, uint32_t lane0, uint32_t n, float *y) {
    if (n == lanes::RB) {  // a whole block (lane0 == 0): one store, not RB scalar copies
        lanes::storeu(y, tot);
        return;
    }
    alignas(64) float t[lanes::RB];
    lanes::store(t, tot);
    for (uint32_t i = 0; i < n; ++i) y[i] = t[lane0 + i];
}

// Positions per pass over a row block (lanes::kPos) and row blocks per pass in a decode step
// (lanes::kDecodeBlocks): a column's weights are decoded (shift + permute, on the vector ports
// the FMAs need too) once for kPos positions, so the FMAs' share grows with kPos as far as the
// registers allow (kPos x kAcc accumulators). Sapphire Rapids VM, 1,536 x 512 2-bit, weights in
// L2, one core: 2 positions with 8 accumulators each 54 GMAC/s, 6 with 4 each 69, 12 with 2 each
// 74-76 (24 with 1 spill); a decode step (one position) 41 -> 43 with 4 blocks of 2 chains side
// by side. The earlier prefill pass, weights decoded once per group into an L1 tile and loaded
// per 3 positions, was bound by loads (a tile load and 3 broadcast loads per 3 FMAs).

// Blocks b .. b+NB-1 (rows clipped to [r0, r0 + count)) at P positions from xh into y.
template <uint32_t FW, bool Wide, uint32_t P, uint32_t NB>
inline void lanes_pass(const CqMatrix &w, const lanes::Book &bk, uint32_t b, uint32_t r0, uint32_t count,
                       const float *xh, size_t xh_stride, float *y, size_t y_stride) {
    const size_t blk_bytes = size_t(w.ngroups) * cq_block_record_bytes(w);
    lanes::F tot[NB][P];
    lanes_matvec<FW, Wide, P, NB>(w, bk, w.blocked + size_t(b) * blk_bytes, blk_bytes, xh, xh_stride, tot);
    for (uint32_t i = 0; i < NB; ++i) {
        const uint32_t bb = b + i, end = r0 + count;
        const uint32_t lo = bb * lanes::RB > r0 ? bb * lanes::RB : r0;
        const uint32_t hi = (bb + 1) * lanes::RB < end ? (bb + 1) * lanes::RB : end;
        for (uint32_t q = 0; q < P; ++q)
            lanes_store(tot[i][q], lo - bb * lanes::RB, hi - lo, y + q * y_stride + (lo - r0));
    }
}

// One pass of n <= P positions (n from 1 to P; one instantiation each).
template <uint32_t FW, bool Wide, uint32_t P>
inline void lanes_pass_n(size_t n, const CqMatrix &w, const lanes::Book &bk, uint32_t b, uint32_t r0, uint32_t count,
                         const float *xh, size_t xh_stride, float *y, size_t y_stride) {
    if constexpr (P > 1)
        if (n < P) return lanes_pass_n<FW, Wide, P - 1>(n, w, bk, b, r0, count, xh, xh_stride, y, y_stride);
    lanes_pass<FW, Wide, P, 1>(w, bk, b, r0, count, xh, xh_stride, y, y_stride);
}

// Positions 0 .. n_pos - 1 of block b in ceil(n_pos / kPos) passes of near-equal size (8
// positions as 4 + 4, not 6 + 2: a short pass decodes its weights for few FMAs).
template <uint32_t FW, bool Wide>
inline void lanes_positions(const CqMatrix &w, const lanes::Book &bk, uint32_t b, uint32_t r0, uint32_t count,
                            const float *xh, size_t xh_stride, size_t n_pos, float *y, size_t y_stride) {
    size_t passes = (n_pos + lanes::kPos - 1) / lanes::kPos;
    for (size_t p = 0; p < n_pos; --passes) {
        const size_t n = (n_pos - p + passes - 1) / passes;
        lanes_pass_n<FW, Wide, lanes::kPos>(n, w, bk, b, r0, count, xh + p * xh_stride, xh_stride, y + p * y_stride,
                                            y_stride);
        p += n;
    }
}

// Blocks b .. b_end - 1 at one position: NB at a time, the rest NB / 2, .., 1 at a time.
template <uint32_t FW, bool Wide, uint32_t NB>
inline void lanes_blocks(const CqMatrix &w, const lanes::Book &bk, uint32_t b, uint32_t b_end, uint32_t r0,
                         uint32_t count, const float *xh, float *y) {
    for (; b + NB <= b_end; b += NB) lanes_pass<FW, Wide, 1, NB>(w, bk, b, r0, count, xh, 0, y, 0);
    if constexpr (NB > 1) lanes_blocks<FW, Wide, NB / 2>(w, bk, b, b_end, r0, count, xh, y);
}

template <uint32_t FW, bool Wide>
void lanes_matmul(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0, uint32_t count,
                  float *y, size_t y_stride) {
    using namespace lanes;
    const Book bk(w.levels, w.width);
    const uint32_t b0 = r0 / RB, b_end = (r0 + count + RB - 1) / RB;
    if (n_pos == 1) return lanes_blocks<FW, Wide, kDecodeBlocks>(w, bk, b0, b_end, r0, count, xh, y);
    for (uint32_t b = b0; b < b_end; ++b)
        lanes_positions<FW, Wide>(w, bk, b, r0, count, xh, xh_stride, n_pos, y, y_stride);
}

void cq_matmul_lanes(const CqMatrix &w, const float *xh, size_t xh_stride, size_t n_pos, uint32_t r0, uint32_t count,
                     float *y, size_t y_stride) {
    switch (w.width) {
    case 2: lanes_matmul<2, false>(w, xh, xh_stride, n_pos, r0, count, y, y_stride); break;
    case 3: lanes_matmul<4, false>(w, xh, xh_stride, n_pos, r0, count, y, y_stride); break;
    default: lanes_matmul<4, true>(w, xh, xh_stride, n_pos, r0, count, y, y_stride); break;
    }
}
constexpr uint32_t kBlockRows = lanes::RB;

// In-register transpose of an 8 x 8 block of 32-bit words: r[i] holds row i; afterwards r[j]
// holds column j (word j of rows 0..7).
inline void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (uint32_t i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);      // r0[0] r1[0] r0[1] r1[1] | r0[4] ..
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // r0[2] r1[2] r0[3] r1[3] | r0[6] ..
    }
    for (uint32_t i = 0; i < 8; i += 4)
        for (uint32_t h = 0; h < 2; ++h) {
            u[i + h] = _mm256_unpacklo_epi64(t[i + h], t[i + 2 + h]);      // words 0 (h 0) / 2 (h 1) of 4 rows
            u[i + 2 + h] = _mm256_unpackhi_epi64(t[i + h], t[i + 2 + h]);  // words 1 / 3
        }
    // u[0..3]: words 0, 2, 1, 3 of rows 0..3 (and 4, 6, 5, 7 in the upper halves); u[4..7] the same
    // of rows 4..7: join the 128-bit halves.
    static constexpr uint32_t kWord[4] = {0, 2, 1, 3};
    for (uint32_t q = 0; q < 4; ++q) {
        r[kWord[q]] = _mm256_permute2x128_si256(u[q], u[4 + q], 0x20);
        r[kWord[q] + 4] = _mm256_permute2x128_si256(u[q], u[4 + q], 0x31);
    }
}

// Writes the rows-in-lanes records of row block b of w (w.block_rows == RB, all RB rows present,
// width 2 or 4, whole words per group): record line j holds word j of the RB rows. Groups of a
// multiple of 8 words (2-bit and 4-bit groups of 128) go through 8 x 8 register transposes; other
// whole-word groups through gathers. Returns false (nothing written) for the other cases, which
// dispatch.cpp's portable loop does.
bool cq_block_rows_fast(const CqMatrix &w, uint32_t b, uint8_t *dst) {
    using namespace lanes;
    const uint32_t gbytes = w.group * w.width / 8;
    if (w.width == 3 || gbytes % 4 || (b + 1) * RB > w.rows || w.block_rows != RB) return false;
    const uint32_t words = gbytes / 4;
    const size_t rec_bytes = cq_block_record_bytes(w);
    const uint8_t *row0 = w.packed + size_t(b) * RB * w.row_bytes;
    alignas(64) int32_t off[RB];
    for (uint32_t i = 0; i < RB; ++i) off[i] = int32_t(i * w.row_bytes);
#if defined(__AVX512F__)
    const __m512i vo = _mm512_load_si512(off);
#else
    const __m256i vo = _mm256_load_si256(reinterpret_cast<const __m256i *>(off));
#endif
    for (uint32_t g = 0; g < w.ngroups; ++g) {
        uint8_t *r = dst + size_t(g) * rec_bytes;
        float *nrm = reinterpret_cast<float *>(r);
        for (uint32_t i = 0; i < RB; ++i) nrm[i] = w.norms[size_t(b * RB + i) * w.ngroups + g];
        uint32_t *wd = reinterpret_cast<uint32_t *>(r + 4 * RB);
        const uint8_t *src = row0 + size_t(g) * gbytes;
        if (words % 8 == 0) {
            // Gathers of 16 rows are slow on some cores (AMD Zen 4/5: ~8 ms of a 15 ms needle2
            // load); loads, 24 shuffles per 8 x 8 block and stores are not.
            for (uint32_t j0 = 0; j0 < words; j0 += 8)
                for (uint32_t i0 = 0; i0 < RB; i0 += 8) {
                    __m256i m[8];
                    for (uint32_t i = 0; i < 8; ++i)
                        m[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + size_t(i0 + i) * w.row_bytes + 4 * j0));
                    transpose8_epi32(m);
                    for (uint32_t j = 0; j < 8; ++j)
                        _mm256_storeu_si256(reinterpret_cast<__m256i *>(wd + size_t(j0 + j) * RB + i0), m[j]);
                }
            continue;
        }
        for (uint32_t j = 0; j < words; ++j) {
#if defined(__AVX512F__)
            _mm512_store_si512(wd + size_t(j) * RB, _mm512_i32gather_epi32(vo, src + 4 * j, 1));
#else
            _mm256_store_si256(reinterpret_cast<__m256i *>(wd + size_t(j) * RB),
                               _mm256_i32gather_epi32(reinterpret_cast<const int *>(src + 4 * j), vo, 1));
#endif
        }
    }
    return true;
}
#else
bool cq_block_rows_fast(const CqMatrix &, uint32_t, uint8_t *) { return false; }
constexpr uint32_t kBlockRows = 0;  // this ISA reads the stored form only
#endif

void fwht(float *x, uint32_t m) {
    uint32_t h = 1;
#if defined(NEEDLE_FUSED_DECODE)
    // Stages h = 1, 2, 4 inside each 8-float register: the partner comes from a lane swap, the
    // low lanes take a + c and the high lanes c' - a' (= a - c): the same additions as below.
    if (m >= 8) {
        for (uint32_t i = 0; i < m; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i), t;
            t = _mm256_permute_ps(v, 0xB1);
            v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xAA);
            t = _mm256_permute_ps(v, 0x4E);
            v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xCC);
            t = _mm256_permute2f128_ps(v, v, 0x01);
            v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xF0);
            _mm256_storeu_ps(x + i, v);
        }
        h = 8;
    }
#elif defined(__AVX512F__)
    // Stages h = 1, 2, 4, 8 inside each 16-float register, the same way (partners by in-lane
    // permutes for h = 1, 2 and 128-bit block swaps for h = 4, 8; the mask picks c' - a').
    if (m >= 16) {
        for (uint32_t i = 0; i < m; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i), t;
            t = _mm512_permute_ps(v, 0xB1);
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, t), 0xAAAA, t, v);
            t = _mm512_permute_ps(v, 0x4E);
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, t), 0xCCCC, t, v);
            t = _mm512_shuffle_f32x4(v, v, 0xB1);
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, t), 0xF0F0, t, v);
            t = _mm512_shuffle_f32x4(v, v, 0x4E);
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, t), 0xFF00, t, v);
            _mm512_storeu_ps(x + i, v);
        }
        h = 16;
    }
#endif
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
#if defined(__AVX2__)
    if (w.blocked && w.block_rows == lanes::RB) {
        cq_matmul_lanes(w, xh, xh_stride, n_pos, r0, count, y, y_stride);
        return;
    }
#endif
    alignas(64) float ug[kRowBlock][4096];  // decoded groups of a row block; group <= 4096 (loader)
    RowAcc acc[kPosTile][kRowBlock];
    const Levels lv(w);
    const float *u[kRowBlock] = {ug[0], ug[1], ug[2], ug[3]};
    for (uint32_t rb = r0; rb < r0 + count; rb += kRowBlock) {
        const uint32_t R = (r0 + count - rb) < kRowBlock ? (r0 + count - rb) : kRowBlock;
        float *yb = y + (rb - r0);
#if defined(NEEDLE_FUSED_DECODE)
        if (n_pos == 1) {
            cq_matvec_fused(w, lv, xh, rb, R, yb);
            continue;
        }
#endif
        for (size_t p0 = 0; p0 < n_pos; p0 += kPosTile) {
            const uint32_t P = uint32_t(n_pos - p0 < kPosTile ? n_pos - p0 : kPosTile);
            for (uint32_t p = 0; p < P; ++p)
                for (uint32_t j = 0; j < R; ++j) acc[p][j] = {Vec(0.0f), 0.0f};
            for (uint32_t g = 0; g < w.ngroups; ++g) {
                // Each group is decoded once per tile of positions (§9).
                float nrm[kRowBlock];
                for (uint32_t j = 0; j < R; ++j) {
                    decode_group(w, lv, rb + j, g, ug[j]);
                    nrm[j] = w.norms[size_t(rb + j) * w.ngroups + g];
                }
                const float *xg = xh + p0 * xh_stride + size_t(g) * w.group;
                for (uint32_t p = 0; p < P; ++p) dot_rows(u, R, xg + p * xh_stride, w.group, nrm, acc[p]);
            }
            for (uint32_t p = 0; p < P; ++p)
                for (uint32_t j = 0; j < R; ++j) yb[(p0 + p) * y_stride + j] = finish(acc[p][j]);
        }
    }
}

void cq_dequantize_row(const CqMatrix &w, uint32_t r, float *out) {
    alignas(64) float buf[4096];
    const Levels lv(w);
    for (uint32_t g = 0; g < w.ngroups; ++g) {
        decode_group(w, lv, r, g, buf);
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

#include "kernels/isa/attention_simd.h"

}  // namespace

// Per-position element-wise kernels of this ISA (kernels_rowmath.cpp).
void sinkhorn(float *m, uint32_t n, uint32_t count);
void silu(const float *x, uint32_t n, float *y);
void sigmoid_gate(float *x, const float *g, uint32_t n);
void mhc_mix(const float *R, const float *hp, const float *y, uint32_t N, uint32_t D, float *X, float *Xs);
void pool_probe(const float *q, const float *cells, size_t cell_stride, const uint32_t *tokens, uint32_t n,
                uint32_t D, double inv_sqrt_d, double *a);

// FAST kernels of this ISA (kernels_i8.cpp).
void cq_fast_quantize(const float *xh, size_t xh_stride, size_t n_pos, uint32_t cols_pad, uint32_t group,
                      int8_t *q2, size_t q2_stride, int8_t *q4, size_t q4_stride, float *scale, int32_t *sum);
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride);

const KernelTable &table() {
    static const KernelTable t{NEEDLE_ISA_NAME, cq_prepare_input, cq_matmul, cq_dequantize_row, fwht,
                               rms_unit, zcrms, rope, attention_rows<float>, attention_rows<int8_t>,
                               sinkhorn, silu, pool_probe, kBlockRows, cq_block_rows_fast, cq_fast_quantize, cq_matmul_fast,
                               sigmoid_gate, mhc_mix};
    return t;
}

}  // namespace NEEDLE_ISA_NS
}  // namespace needle
