// Intrinsics of the FAST (int8) rows-in-lanes CQ kernels (kernels_i8.cpp), one section per ISA:
// xsimd 8.1 has no byte shuffle, no u8 x s8 dot product and no 8-bit sign operations. A vector I
// holds one 32-bit lane per row of a block of RB rows (the rows-in-lanes copy, cq_matrix.h).
// Included inside namespace NEEDLE_ISA_NS.
#pragma once

#if defined(__AVX512F__)
namespace i8 {
constexpr uint32_t RB = 16;
constexpr uint32_t kPos = 4;  // positions per pass over a row block's groups
using I = __m512i;
using F = __m512;
inline I load_words(const uint32_t *p) { return _mm512_load_si512(p); }
inline I mask(uint32_t m) { return _mm512_set1_epi32(int(m)); }
template <int S>
inline I srl_and(I v, I m) { return _mm512_and_si512(S ? _mm512_srli_epi32(v, S) : v, m); }
inline I zero() { return _mm512_setzero_si512(); }
inline I add(I a, I b) { return _mm512_add_epi32(a, b); }
inline I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
inline I bcast(int32_t v) { return _mm512_set1_epi32(v); }
inline F cvt(I v) { return _mm512_cvtepi32_ps(v); }
inline F fload(const float *p) { return _mm512_load_ps(p); }  // 64-byte aligned record norms
inline F fbcast(float v) { return _mm512_set1_ps(v); }
inline F fadd(F a, F b) { return _mm512_add_ps(a, b); }
inline F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F fzero() { return _mm512_setzero_ps(); }
inline void fstore(float *p, F v) { _mm512_store_ps(p, v); }

#if defined(NEEDLE_I8_VNNI)
// vpdpbusd multiplies unsigned by signed bytes: the book is stored as wq + 128 (u8) and the
// dot of a group is corrected by 128 * sum(q) (kUnsignedBook).
constexpr bool kUnsignedBook = true;
struct Book {
    I t;
    explicit Book(const int8_t *wq) {
        alignas(64) uint8_t e[64];
        for (uint32_t i = 0; i < 64; ++i) e[i] = uint8_t(int32_t(wq[i % 16]) + 128);
        t = _mm512_load_si512(e);
    }
    I operator()(I idx) const { return _mm512_shuffle_epi8(t, idx); }  // per 128-bit lane, low nibble
};
// acc += 4-byte dot of each lane's weights w with the broadcast activation bytes x4.
inline I dot(I acc, I w, int32_t x4) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4)); }
#else
// Without VNNI: |w| (u8) times x with w's sign (s8) by vpmaddubsw (pairs <= 2 * 127^2, no
// saturation), then vpmaddwd by ones. AVX-512BW has no vpsignb: x is negated under w's sign mask.
constexpr bool kUnsignedBook = false;
struct Book {
    I t;
    explicit Book(const int8_t *wq) {
        alignas(64) int8_t e[64];
        for (uint32_t i = 0; i < 64; ++i) e[i] = wq[i % 16];
        t = _mm512_load_si512(e);
    }
    I operator()(I idx) const { return _mm512_shuffle_epi8(t, idx); }
};
inline I dot(I acc, I w, int32_t x4) {
    const I x = _mm512_set1_epi32(x4);
    const I sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    const I p16 = _mm512_maddubs_epi16(_mm512_abs_epi8(w), sx);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
}
#endif
}  // namespace i8
#elif defined(__AVX2__)
namespace i8 {
constexpr uint32_t RB = 8;
constexpr uint32_t kPos = 2;  // 16 registers
using I = __m256i;
using F = __m256;
inline I load_words(const uint32_t *p) { return _mm256_load_si256(reinterpret_cast<const __m256i *>(p)); }
inline I mask(uint32_t m) { return _mm256_set1_epi32(int(m)); }
template <int S>
inline I srl_and(I v, I m) { return _mm256_and_si256(S ? _mm256_srli_epi32(v, S) : v, m); }
inline I zero() { return _mm256_setzero_si256(); }
inline I add(I a, I b) { return _mm256_add_epi32(a, b); }
inline I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
inline I bcast(int32_t v) { return _mm256_set1_epi32(v); }
inline F cvt(I v) { return _mm256_cvtepi32_ps(v); }
inline F fload(const float *p) { return _mm256_load_ps(p); }
inline F fbcast(float v) { return _mm256_set1_ps(v); }
inline F fadd(F a, F b) { return _mm256_add_ps(a, b); }
inline F fmul(F a, F b) { return _mm256_mul_ps(a, b); }
inline F fzero() { return _mm256_setzero_ps(); }
inline void fstore(float *p, F v) { _mm256_store_ps(p, v); }

// vpmaddubsw (u8 x s8) with the sign trick: |w| times sign(x, w), pairs <= 2 * 127^2.
constexpr bool kUnsignedBook = false;
struct Book {
    I t;
    explicit Book(const int8_t *wq) {
        alignas(32) int8_t e[32];
        for (uint32_t i = 0; i < 32; ++i) e[i] = wq[i % 16];
        t = _mm256_load_si256(reinterpret_cast<const __m256i *>(e));
    }
    I operator()(I idx) const { return _mm256_shuffle_epi8(t, idx); }
};
inline I dot(I acc, I w, int32_t x4) {
    const I p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(x4), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
}  // namespace i8
#endif
