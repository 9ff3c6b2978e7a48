// One table of kernel entry points per instruction set. The scalar table (kernels_scalar.cpp)
// is the portable reference; kernels_simd.cpp is one xsimd source compiled once per ISA
// (CMake: needle_isa_<name>), each defining its own namespace. dispatch.cpp picks one table at
// first use. Every entry has the contract of the function of the same name in kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cq_fast.h"
#include "kernels/cq_matrix.h"
#include "kernels/kv_ring.h"

namespace needle {

struct KernelTable {
    const char *isa;
    void (*cq_prepare_input)(const float *, uint32_t, uint32_t, uint32_t, float *);
    void (*cq_matmul)(const CqMatrix &, const float *, size_t, size_t, uint32_t, uint32_t, float *, size_t);
    void (*cq_dequantize_row)(const CqMatrix &, uint32_t, float *);
    void (*fwht)(float *, uint32_t);
    void (*rms_unit)(const float *, uint32_t, float *);
    void (*zcrms)(const float *, const float *, uint32_t, float *);
    void (*rope)(float *, uint32_t, const float *, const float *);
    void (*attention_rows)(const float *, size_t, uint32_t, const KvRing<float> &, const KvRing<float> &, uint32_t,
                           uint32_t, float *, size_t, float *, size_t);
    void (*attention_rows_i8)(const float *, size_t, uint32_t, const KvRing<int8_t> &, const KvRing<int8_t> &,
                              uint32_t, uint32_t, float *, size_t, float *, size_t);
    void (*sinkhorn)(float *, uint32_t, uint32_t);
    void (*silu)(const float *, uint32_t, float *);
    void (*pool_probe)(const float *, const float *, size_t, const uint32_t *, uint32_t, uint32_t, double, double *);
    // Rows per block of the rows-in-lanes CQ copy this table's cq_matmul reads (cq_matrix.h), or
    // 0: it reads the stored form only. A matrix whose block_rows differ is read in stored form.
    uint32_t cq_block_rows;
    // Writes row block b's records of w's rows-in-lanes copy at dst (the block's first record)
    // when it can do so fast, else returns false and writes nothing (dispatch.cpp then does).
    bool (*cq_block_rows_fast)(const CqMatrix &w, uint32_t b, uint8_t *dst);
    // FAST precision (cq_fast.h). Quantises n_pos prepared inputs (xh + p * xh_stride, cols_pad
    // floats, groups of `group`) into layout 2 at q2 and/or layout 4 at q4 (either may be null;
    // q*_stride bytes per position), scale/sum [n_pos][cols_pad / group]. Same bits in every ISA.
    void (*cq_fast_quantize)(const float *xh, size_t xh_stride, size_t n_pos, uint32_t cols_pad, uint32_t group,
                             int8_t *q2, size_t q2_stride, int8_t *q4, size_t q4_stride, float *scale, int32_t *sum);
    // Rows r0..r0+count-1 of w against the quantised inputs of n_pos positions into y
    // (y_stride floats per position): the bits of the scalar reference, whatever the ISA.
    void (*cq_matmul_fast)(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count,
                           float *y, size_t y_stride);
    void (*sigmoid_gate)(float *, const float *, uint32_t);
    void (*mhc_mix)(const float *, const float *, const float *, uint32_t, uint32_t, float *, float *);
};

namespace scalar {
const KernelTable &table();
// The FAST reference (kernels_fast.cpp): the scalar table's entries, and the fallback of the
// vectorised FAST kernels for matrices they cannot read.
void cq_fast_quantize(const float *xh, size_t xh_stride, size_t n_pos, uint32_t cols_pad, uint32_t group,
                      int8_t *q2, size_t q2_stride, int8_t *q4, size_t q4_stride, float *scale, int32_t *sum);
void cq_matmul_fast(const CqMatrix &w, const CqFastInput &x, size_t n_pos, uint32_t r0, uint32_t count, float *y,
                    size_t y_stride);
}  // namespace scalar
#define NEEDLE_DECLARE_ISA(name) namespace isa_##name { const KernelTable &table(); }
NEEDLE_DECLARE_ISA(sse4_2)
NEEDLE_DECLARE_ISA(avx2)
NEEDLE_DECLARE_ISA(avx512)
NEEDLE_DECLARE_ISA(neon)
#undef NEEDLE_DECLARE_ISA

// The table in use (chosen once: best ISA of this CPU, or NEEDLE_FORCE_ISA if lower).
const KernelTable &active_kernels();

// Every table of this build that this CPU runs, best first, scalar last (tests compare each with
// scalar). Writes at most `max` pointers to out; returns how many.
int supported_kernel_tables(const KernelTable **out, int max);

// Tests only (not thread-safe against running kernels): makes `name` ("scalar", "avx2", ...)
// the active table for everything that follows, if this CPU runs it and it is built; false
// otherwise. A model keeps the rows-in-lanes copies of the ISA it was loaded under; a table
// with other block rows reads such a model in stored form, so results stay correct.
bool use_kernel_isa(const char *name);

}  // namespace needle
