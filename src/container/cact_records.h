// Record-level pieces shared by the v2 and v3 .cact parsers (container-v2.md §4/§7,
// container-v3.md §3): the 44-byte directory record, CQ blob geometry, float scans and the
// message helpers. Each generation's parser (cact_v2.cpp, cact_v3.cpp) applies its own rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace needle {

constexpr uint32_t kCactTagV3 = 0x05E12A84u;  // Needle 3 (container-v3.md)
constexpr size_t kRecordBytes = 44;
constexpr uint32_t kCodebookLen = 28;

enum class DType : uint8_t { F16 = 1, F32 = 2, CQ = 3, RAW = 4 };

// One directory record with a pointer to its (bounds-checked) blob.
struct TensorRecord {
    DType dtype;
    uint8_t ndim;
    uint32_t shape[4];
    uint64_t offset, nbytes;
    uint32_t group, bits;
    const uint8_t *data;  // base + offset, valid for nbytes bytes (set by the parser)
};

// Decodes the 44 bytes at p (fields unchecked; data = null). pad receives the u16 at byte 2.
TensorRecord read_record(const uint8_t *p, uint16_t &pad);

// CQ blob geometry: row_bytes, packed code bytes, groups per row and the exact blob size
// (codes + f16 norms). False when a product overflows 64 bits. Needs group >= 8, power of two.
struct CqLayout {
    uint64_t row_bytes, packed, ngroups, nbytes;
};
bool cq_layout(const TensorRecord &r, CqLayout &out);

bool is_pow2(uint64_t x);
const char *dtype_name(uint8_t d);  // "FP16", "FP32", "CQ", "RAW" or "?"
std::string shape_str(const uint64_t *dims, uint32_t ndim);
std::string shape_str(const TensorRecord &r);

// Index of the first non-finite binary16 of the n little-endian values at p, or n.
uint64_t first_nonfinite_f16(const uint8_t *p, uint64_t n);
const char *f16_kind(uint16_t h);  // "NaN" or "inf" of a non-finite binary16

// Reads the 28 codebook floats at p into cb; "" or a message naming the first level that is
// not finite or not above its predecessor (each book ascending).
std::string read_codebook_levels(const uint8_t *p, float *cb);

}  // namespace needle
