// The CQ weight view shared by the kernels and their per-ISA tables. Kept apart from
// kernels.h so that the per-ISA sources cannot call the dispatching wrappers by accident.
#pragma once

#include <cstddef>
#include <cstdint>

namespace needle {

// A Cactus-Quants matrix W[rows][cols] in its stored, rotated form (cq-kernels.md §1, §5).
// Views into the container plus the f32 norms converted at load.
struct CqMatrix {
    const uint8_t *packed = nullptr;  // rows * row_bytes, LSB-first indices (container-v2.md §7.1)
    const float *norms = nullptr;     // [rows][ngroups] f32
    const float *lut = nullptr;       // width 2/ternary: [256][4]; width 4: [256][2]; width 3: null
    const float *levels = nullptr;    // level of each index code (2^width entries; ternary by crumb)
    uint32_t rows = 0, cols = 0, cols_pad = 0, ngroups = 0, group = 0;
    uint32_t width = 0;               // bits per stored index: 2, 3 or 4 (ternary stores 2)
    uint32_t row_bytes = 0;
};

}  // namespace needle
