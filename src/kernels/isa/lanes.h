// Intrinsics of the rows-in-lanes CQ kernels (kernels_simd.cpp), one section per ISA: xsimd 8.1
// has no runtime lane permute. A vector F holds one float per row of a block of RB rows; a
// vector I holds one 32-bit index word per row. Included inside namespace NEEDLE_ISA_NS.
#pragma once

#if defined(__AVX512F__)
namespace lanes {
constexpr uint32_t RB = 16;
// Column k of a group goes to accumulator k % kAcc of its row block and position. A prefill pass
// takes kPos positions (kPos x kAcc = 24 accumulators of 32 registers: the more positions, the
// fewer decodes per FMA); a decode step kDecodeBlocks row blocks (8 independent FMA chains).
constexpr uint32_t kAcc = 2;
constexpr uint32_t kPos = 12;
constexpr uint32_t kDecodeBlocks = 4;
using F = __m512;
using I = __m512i;
inline F zero() { return _mm512_setzero_ps(); }
inline F load(const float *p) { return _mm512_load_ps(p); }  // 64-byte aligned
inline I load_words(const uint32_t *p) { return _mm512_load_si512(p); }
inline F bcast(float x) { return _mm512_set1_ps(x); }
inline F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F add(F a, F b) { return _mm512_add_ps(a, b); }
template <int S>
inline I srl(I v) { return _mm512_srli_epi32(v, S); }
inline void store(float *p, F v) { _mm512_store_ps(p, v); }
inline void storeu(float *p, F v) { _mm512_storeu_ps(p, v); }

// The level of each lane's low index field. vpermps reads the low 4 bits, so the 16-entry
// table repeats a 4- or 8-level book; 3-bit indices are stored in nibbles whose top bit is 0.
// Those 4 bits hold two 2-bit fields: a second table t2[i] = level[i >> 2] reads the upper
// one, so a 2-bit word needs one shift per two columns (kFieldPairs), not one per column.
constexpr bool kFieldPairs = true;
struct Book {
    F t, t2;
    explicit Book(const float *levels, uint32_t width) {
        alignas(64) float e[16], e2[16];
        const uint32_t n = width == 2 ? 4u : width == 3 ? 8u : 16u;
        for (uint32_t i = 0; i < 16; ++i) e[i] = levels[i % n], e2[i] = levels[(i >> 2) % n];
        t = _mm512_load_ps(e);
        t2 = _mm512_load_ps(e2);
    }
    template <bool Wide>
    F operator()(I idx) const { return _mm512_permutexvar_ps(idx, t); }
    F second(I idx) const { return _mm512_permutexvar_ps(idx, t2); }  // the field at bits 2-3 (2-bit book)
};
}  // namespace lanes
#else  // AVX2
namespace lanes {
constexpr uint32_t RB = 8;
constexpr uint32_t kAcc = 2;  // as on AVX-512, within 16 registers: 8 accumulators in a pass
constexpr uint32_t kPos = 4;
constexpr uint32_t kDecodeBlocks = 4;
using F = __m256;
using I = __m256i;
inline F zero() { return _mm256_setzero_ps(); }
inline F load(const float *p) { return _mm256_load_ps(p); }  // 32-byte aligned
inline I load_words(const uint32_t *p) { return _mm256_load_si256(reinterpret_cast<const __m256i *>(p)); }
inline F bcast(float x) { return _mm256_set1_ps(x); }
inline F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
inline F add(F a, F b) { return _mm256_add_ps(a, b); }
template <int S>
inline I srl(I v) { return _mm256_srli_epi32(v, S); }
inline void store(float *p, F v) { _mm256_store_ps(p, v); }
inline void storeu(float *p, F v) { _mm256_storeu_ps(p, v); }

// vpermps reads the low 3 bits: a 4-level book is stored twice, an 8-level book once; a 16-level
// book (Wide) takes two permutes and bit 3 of the nibble picks the upper half. Two 2-bit fields
// do not fit 3 bits: one shift per column.
constexpr bool kFieldPairs = false;
struct Book {
    F lo, hi;
    explicit Book(const float *levels, uint32_t width) {
        alignas(32) float e[16];
        const uint32_t n = width == 2 ? 4u : width == 3 ? 8u : 16u;
        for (uint32_t i = 0; i < 16; ++i) e[i] = levels[i % n];
        lo = _mm256_load_ps(e);
        hi = _mm256_load_ps(e + 8);
    }
    F second(I) const { return zero(); }  // unused: kFieldPairs is false (3 index bits)
    template <bool Wide>
    F operator()(I idx) const {
        const F a = _mm256_permutevar8x32_ps(lo, idx);
        if (!Wide) return a;
        return _mm256_blendv_ps(a, _mm256_permutevar8x32_ps(hi, idx), _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    }
};
}  // namespace lanes
#endif
