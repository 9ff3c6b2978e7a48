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

}  // namespace needle
