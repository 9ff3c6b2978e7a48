// One table of kernel entry points per instruction set. The scalar table (kernels_scalar.cpp)
// is the portable reference; kernels_simd.cpp is one xsimd source compiled once per ISA
// (CMake: needle_isa_<name>), each defining its own namespace. dispatch.cpp picks one table at
// first use. Every entry has the contract of the function of the same name in kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>

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
    void (*attention_head)(const float *, const KvRing<float> &, const KvRing<float> &, uint32_t, uint32_t,
                           float *, float *);
    void (*attention_head_i8)(const float *, const KvRing<int8_t> &, const KvRing<int8_t> &, uint32_t,
                              uint32_t, float *, float *);
    // Rows per block of the rows-in-lanes CQ copy this table's cq_matmul reads (cq_matrix.h), or
    // 0: it reads the stored form only. A matrix whose block_rows differ is read in stored form.
    uint32_t cq_block_rows;
    // Writes row block b's records of w's rows-in-lanes copy at dst (the block's first record)
    // when it can do so fast, else returns false and writes nothing (dispatch.cpp then does).
    bool (*cq_block_rows_fast)(const CqMatrix &w, uint32_t b, uint8_t *dst);
};

namespace scalar { const KernelTable &table(); }
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
