// IEEE-754 binary16 -> binary32, exact for every input (normals, subnormals, +-inf, NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace needle {

inline float f16_to_f32(uint16_t h) {
    // Move exponent and mantissa into place and rebias the exponent (15 -> 127); inf/NaN get the
    // all-ones f32 exponent; zeros and subnormals are made by one exact float subtraction
    // (mant * 2^-24 = as_float((113 << 23) | mant << 13) - 2^-14). Branch-light, so a load-time
    // loop over every CQ norm stays cheap (~330,000 of them in needle2).
    uint32_t bits = uint32_t(h & 0x7fffu) << 13;
    const uint32_t exp = bits & 0x0f800000u;
    bits += (127u - 15u) << 23;
    float f;
    if (exp == 0x0f800000u) {
        bits += (128u - 16u) << 23;
        std::memcpy(&f, &bits, sizeof f);
    } else if (exp == 0) {
        bits += 1u << 23;
        std::memcpy(&f, &bits, sizeof f);
        f -= 6.103515625e-05f;  // 2^-14 = as_float(113 << 23)
    } else {
        std::memcpy(&f, &bits, sizeof f);
    }
    uint32_t out;
    std::memcpy(&out, &f, sizeof out);
    out |= uint32_t(h & 0x8000u) << 16;
    std::memcpy(&f, &out, sizeof f);
    return f;
}

// dst[i] = f16_to_f32(little-endian binary16 i of src), for i < n. The same bits as f16_to_f32,
// written without branches so the compiler vectorises it (every CQ norm is converted at load).
inline void f16_to_f32_n(const uint8_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; ++i) {
        uint16_t h16;  // little-endian hosts only, as the whole loader (core/bytes.h)
        std::memcpy(&h16, src + 2 * i, sizeof h16);
        const uint32_t h = h16;
        const uint32_t em = (h & 0x7fffu) << 13, exp = em & 0x0f800000u;
        uint32_t normal = em + ((127u - 15u) << 23);
        normal += (0u - uint32_t(exp == 0x0f800000u)) & ((128u - 16u) << 23);  // inf / NaN
        const uint32_t sub_bits = em + ((127u - 15u + 1u) << 23);
        float sub;
        std::memcpy(&sub, &sub_bits, sizeof sub);
        sub -= 6.103515625e-05f;  // zero / subnormal: exact
        uint32_t sub_u;
        std::memcpy(&sub_u, &sub, sizeof sub_u);
        const uint32_t is_sub = 0u - uint32_t(exp == 0);  // masks, not branches: vectorisable
        const uint32_t bits = (sub_u & is_sub) | (normal & ~is_sub) | (h & 0x8000u) << 16;
        std::memcpy(dst + i, &bits, sizeof bits);
    }
}

// Round-to-nearest-even binary32 -> binary16 (used by the model writer; overflow gives inf).
inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t exp = (x >> 23) & 0xffu;
    uint32_t mant = x & 0x7fffffu;
    if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int e = int(exp) - 127 + 15;
    if (e >= 0x1f) return uint16_t(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return sign;
        mant |= 0x800000u;
        const uint32_t shift = uint32_t(14 - e);
        uint32_t half = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1);
        const uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return uint16_t(sign | half);
    }
    uint32_t half = (uint32_t(e) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: correct
    return uint16_t(sign | half);
}

}  // namespace needle
