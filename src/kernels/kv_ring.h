// A KV ring as the attention kernels read it (model-v2.md §4.3): the row of position j lives at
// base + (j % ring) * dim. Rows are float, or int8 with one f32 scale per slot (row value =
// scale * int8). A plain aggregate on purpose: no member functions, so no inline symbol can be
// shared between the per-ISA objects and the baseline ones (kernels_simd.cpp).
#pragma once

#include <cstdint>

namespace needle {

template <class T>
struct KvRing {
    const T *base;
    const float *scales;  // [ring] for int8 rows; null for f32 rows (scale 1)
    uint32_t dim, ring;
};

}  // namespace needle
