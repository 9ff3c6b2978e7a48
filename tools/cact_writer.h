// Writer of valid .cact v2 containers with seeded random weights (container-v2.md §1-§9,
// quantisation per cq-kernels.md §3). Used to make the bundled demo model and, in tests,
// containers of any geometry (edge cases the fixtures do not cover).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace needle::writer {

struct Geometry {
    uint32_t vocab_size = 1024;
    uint32_t d_model = 128;
    uint32_t num_heads = 4;
    uint32_t num_kv_heads = 2;
    uint32_t num_layers = 4;
    uint32_t head_dim = 32;
    uint32_t max_seq_len = 512;
    uint32_t kv_window = 256;  // header value; 0 = "size from the KV budget"
    uint32_t kv_bits = 8;
    uint32_t mhc_lanes = 4;
    uint32_t engram_slots = 257;
    uint32_t engram_sub_dim = 64;
    uint32_t engram_heads = 2;                // tables per order; T = heads * orders
    std::vector<uint32_t> engram_orders{2, 3};  // 1..4 entries
    std::vector<uint32_t> engram_sites{1, 2};   // 0..4 layer indices
    uint32_t engram_conv_taps = 4;
    float rope_theta = 10000.0f;
    uint32_t group = 128;                     // CQ group size (power of two, 8..4096)
    // CQ widths per tensor class: 2, 3, 4, or 5 (= ternary).
    uint32_t bits_embedding = 4, bits_mhc = 4, bits_default = 2;
    bool with_heads = false;     // contrastive (P 4, out 32) + confidence (P 8, out 1) heads
    bool with_tokenizer = true;  // RAW tokenizer blob as the last record
};

// Weights supplied by a trainer (tools/train/export.py) instead of seeded random ones.
struct GivenTensor {
    std::vector<uint32_t> shape;  // must equal the canonical slot's shape (container-v2.md §5.1)
    std::vector<float> values;    // row-major, prod(shape) values
    uint32_t bits = 0;            // CQ width of a CQ slot (2, 3, 4, 5 = ternary); 0 = the class
                                  // default of Geometry (bits_embedding/_mhc/_default); FP16: unused
};
struct GivenWeights {
    std::vector<GivenTensor> tensors;  // every canonical tensor through final_norm, in order
    std::vector<uint8_t> tokenizer;    // RAW tokenizer blob (§9); empty = the built-in one
};

// The whole file. Deterministic for (geometry, seed). Throws std::invalid_argument for a geometry
// the format cannot express (vocab smaller than the tokenizer's fixed pieces when with_tokenizer).
std::vector<uint8_t> write_cact_v2(const Geometry &g, uint64_t seed);

// The same layout with the trainer's weights, quantised here (cq-kernels.md §3): one writer for
// tests and export. Throws std::invalid_argument for a geometry the format cannot express, a
// tensor count or shape that is not the canon's, bad bits, or g.with_heads set.
std::vector<uint8_t> write_cact_v2(const Geometry &g, const GivenWeights &weights);

// A tokenizer blob (container-v2.md §9) of exactly `vocab_size` pieces: PAD/EOS/BOS/UNK at ids
// 0..3, the ten chat markers at 4..13, the 256 byte pieces at 14..269, then NORMAL pieces
// (the meta-space and printable ASCII characters, then frequent English pairs and words) with
// scores that make BPE merge them. Needs vocab_size >= 270.
std::vector<uint8_t> build_tokenizer_blob(uint32_t vocab_size);

// Named presets: "demo" (the bundled model), "needle2" (Needle 2 geometry), "tiny-edge"
// (1 layer, 1 head, no engram sites, 1 lane, d_model 24). Throws std::invalid_argument.
Geometry preset(const std::string &name);

}  // namespace needle::writer
