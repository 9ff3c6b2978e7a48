// Little-endian field reads from unaligned memory (container-v2.md conventions: never cast).
#pragma once

#include <cstdint>
#include <cstring>

namespace needle {

inline uint16_t read_u16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t read_u32(const uint8_t *p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline uint64_t read_u64(const uint8_t *p) {
    return uint64_t(read_u32(p)) | (uint64_t(read_u32(p + 4)) << 32);
}
inline float read_f32(const uint8_t *p) {
    uint32_t bits = read_u32(p);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

}  // namespace needle
