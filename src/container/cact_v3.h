// Parsing and validation of the .cact v3 (Needle 3) container (shared/spec/container-v3.md).
//
// parse_cact_v3() applies every check of §5 (plus the three §5.5 gaps) before anything is sized
// from a field, and throws needle::Error(NEEDLE_E_FORMAT) with a message naming the field, the
// tensor index/name and the values. The result points into the caller's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "container/cact_records.h"

namespace needle {

constexpr size_t kHeaderBytesV3 = 196;

// Header fields, container-v3.md §2 (orders/sites already cut to min(n, 4) / min(n, 16)).
struct HeaderV3 {
    uint32_t num_tensors, codebook_len, kv_window, kv_bits, vocab_size, out_vocab, d_model;
    uint32_t num_heads, num_kv_heads, num_layers, qk_head_dim, v_head_dim, max_seq_len, hada_n;
    uint32_t mhc_lanes, sliding_window;
    uint64_t global_mask;  // bit l set: layer l attends globally
    uint32_t qkv_conv_taps, engram_slots, engram_sub_dim, num_engram_tables, engram_conv_taps;
    uint32_t engram_conv_dilation, engram_seed_heads;
    uint32_t n_orders, orders[4], n_sites, sites[16];
    float rope_theta;
};

// Canon positions (§4). Per-layer slots below; T > 0 inserts the three tap records after v.
struct CanonV3 {
    uint32_t layers, sites, per_layer;  // per_layer = 24 + 3 * (T > 0)
    bool taps;
    uint32_t embedding() const { return 0; }
    uint32_t layer(uint32_t l) const { return 1 + per_layer * l; }
    uint32_t mhc() const { return 1 + per_layer * layers; }           // + 0..8
    uint32_t perm() const { return mhc() + 9; }                       // p1, p2
    uint32_t engram(uint32_t s) const { return perm() + 2 + 4 * s; }  // + tables/key/value/taps
    uint32_t final_norm() const { return perm() + 2 + 4 * sites; }
    // Record of layer slot `s` (enum V3Slot), accounting for the optional taps.
    uint32_t at(uint32_t l, uint32_t s) const { return layer(l) + (s >= 4 && !taps ? s - 3 : s); }
};

// Layer slots as if the taps were present (CanonV3::at removes them otherwise).
enum V3Slot : uint32_t {
    kV3NormIn = 0, kV3Q, kV3K, kV3V, kV3QTaps, kV3KTaps, kV3VTaps, kV3QNorm, kV3KNorm, kV3Gate,
    kV3Out, kV3PostNorm, kV3AttnGate, kV3PreHada, kV3D1, kV3D2, kV3B2, kV3D3, kV3D4, kV3W1a, kV3W1b,
    kV3W2a, kV3W2b, kV3W3a, kV3W3b, kV3CondV, kV3CondU
};

// One probe head listed in the manifest: code 1 embedding, 2 confidence, 3 router.
struct ProbeHeadV3 {
    uint32_t code;
    uint32_t first;  // its first record: probes, gain, query, row_bias, proj, bias (router +1)
};

struct ContainerV3 {
    HeaderV3 header;
    float codebook[kCodebookLen];
    std::vector<TensorRecord> tensors;
    CanonV3 canon;
    uint32_t ba = 0, bb = 0;             // Kronecker blocks of hada_n
    std::vector<uint32_t> cond_rank;     // [L]
    std::vector<ProbeHeadV3> heads;      // manifest order
    int32_t confidence = -1;             // index into heads, or -1
    const uint8_t *tokenizer = nullptr;  // the first RAW record (not yet parsed), or null
    uint64_t tokenizer_bytes = 0;
    uint64_t file_bytes = 0;
};

// Validates and indexes `size` bytes at `data`. Throws needle::Error.
ContainerV3 parse_cact_v3(const uint8_t *data, size_t size);

// Canonical name of record `index` ("layer03.k_taps", "engram1.tables", "p1", ...).
std::string tensor_name_v3(const CanonV3 &canon, uint32_t index);

// Number of elements of a float record (nbytes / 2 or / 4).
inline uint64_t float_count(const TensorRecord &t) { return t.dtype == DType::F32 ? t.nbytes / 4 : t.nbytes / 2; }

}  // namespace needle
