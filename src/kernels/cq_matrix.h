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
    // Rows-in-lanes copy for the active kernels (cq_block_matrices, kernels.h), or null: the
    // kernels then read `packed`. Layout (block_rows = RB, 16 on AVX-512, 8 on AVX2): for each
    // block of RB rows (the last one zero-padded), for each group, one record of
    //   RB f32 norms (row order), then words_per_group x RB uint32 words,
    // word j of lane i holding row i's indices of columns 32j/fw .. 32(j+1)/fw - 1 of the group,
    // fw bits each, LSB first (fw = 2 for width 2 and ternary; 4 for widths 3 and 4: a 3-bit
    // index is stored in a nibble). One word per lane is thus 16 (2-bit) or 8 (3/4-bit) columns.
    const uint8_t *blocked = nullptr;
    uint32_t block_rows = 0;
    // FAST precision (cq_fast.h): cq_matmul / cq_matmul_many run this matrix with int8
    // activations. Set at load by a model loaded with NEEDLE_PRECISION_FAST; the kernels read it
    // as a property of the matrix and know nothing of models.
    bool fast = false;
};

// Field width and words per row per group of the rows-in-lanes copy (layout above).
inline uint32_t cq_block_field_bits(const CqMatrix &w) { return w.width == 2 ? 2u : 4u; }
inline uint32_t cq_block_words(const CqMatrix &w) {
    const uint32_t per_word = 32 / cq_block_field_bits(w);
    return (w.group + per_word - 1) / per_word;
}
// Bytes of one (row block, group) record.
inline size_t cq_block_record_bytes(const CqMatrix &w) {
    return size_t(4) * w.block_rows * (1 + cq_block_words(w));
}

}  // namespace needle
