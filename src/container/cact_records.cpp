// Record-level helpers shared by the v2 and v3 parsers (cact_records.h).
#include "container/cact_records.h"

#include <cmath>

#include "core/bytes.h"
#include "core/error.h"

namespace needle {

TensorRecord read_record(const uint8_t *p, uint16_t &pad) {
    TensorRecord r{};
    r.dtype = DType(p[0]);  // range-checked by the parser before any use
    r.ndim = p[1];
    pad = read_u16(p + 2);
    for (int k = 0; k < 4; ++k) r.shape[k] = read_u32(p + 4 + 4 * k);
    r.offset = read_u64(p + 20);
    r.nbytes = read_u64(p + 28);
    r.group = read_u32(p + 36);
    r.bits = read_u32(p + 40);
    r.data = nullptr;
    return r;
}

bool cq_layout(const TensorRecord &r, CqLayout &out) {
    const uint64_t rows = r.shape[0], cols = r.shape[1], G = r.group;
    const uint64_t width = r.bits == 5 ? 2 : r.bits;  // ternary stores 2-bit crumbs
    const uint64_t in_pad = (cols + G - 1) / G * G;   // cols < 2^32, G <= 4096: no wrap
    out.ngroups = in_pad / G;
    out.row_bytes = in_pad * width / 8;               // exact: G is a multiple of 8
    uint64_t norms = 0;
    if (__builtin_mul_overflow(rows, out.row_bytes, &out.packed)) return false;
    if (__builtin_mul_overflow(rows, out.ngroups, &norms)) return false;
    if (__builtin_mul_overflow(norms, uint64_t(2), &norms)) return false;
    return !__builtin_add_overflow(out.packed, norms, &out.nbytes);
}

bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

const char *dtype_name(uint8_t d) {
    switch (d) {
        case 1: return "FP16";
        case 2: return "FP32";
        case 3: return "CQ";
        case 4: return "RAW";
        default: return "?";
    }
}

std::string shape_str(const uint64_t *dims, uint32_t ndim) {
    std::string s = "[";
    for (uint32_t k = 0; k < ndim; ++k) s += strf(k ? ", %llu" : "%llu", (unsigned long long)dims[k]);
    return s + "]";
}

std::string shape_str(const TensorRecord &r) {
    uint64_t dims[4] = {r.shape[0], r.shape[1], r.shape[2], r.shape[3]};
    return shape_str(dims, r.ndim > 4 ? 4 : r.ndim);
}

namespace {
bool f16_nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
}  // namespace

const char *f16_kind(uint16_t h) { return (h & 0x03ffu) ? "NaN" : "inf"; }

// Blocks of 256 are tested without an early exit (so the compiler vectorises them): the scan of
// every norm and FP16 tensor is part of each load.
uint64_t first_nonfinite_f16(const uint8_t *p, uint64_t n) {
    uint64_t k = 0;
    for (; k + 256 <= n; k += 256) {
        unsigned any = 0;
        for (uint64_t j = k; j < k + 256; ++j) any |= unsigned(f16_nonfinite(read_u16(p + 2 * j)));
        if (any) break;
    }
    for (; k < n; ++k)
        if (f16_nonfinite(read_u16(p + 2 * k))) return k;
    return n;
}

std::string read_codebook_levels(const uint8_t *p, float *cb) {
    struct Book { uint32_t first, count, bits; };
    const Book books[] = {{0, 4, 2}, {4, 8, 3}, {12, 16, 4}};
    for (uint32_t i = 0; i < kCodebookLen; ++i) cb[i] = read_f32(p + 4 * i);
    for (const Book &b : books) {
        for (uint32_t k = 0; k < b.count; ++k) {
            const float v = cb[b.first + k];
            if (!std::isfinite(v))
                return strf("codebook: %u-bit level %u is not finite (%g)", b.bits, k, double(v));
            if (k > 0 && !(v > cb[b.first + k - 1]))
                return strf("codebook: %u-bit level %u = %.9g is not above level %u = %.9g", b.bits,
                            k, double(v), k - 1, double(cb[b.first + k - 1]));
        }
    }
    return "";
}

}  // namespace needle
