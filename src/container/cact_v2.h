// Parsing and validation of the .cact v2 container (spec: shared/spec/container-v2.md).
//
// parse_cact_v2() checks every rule of §12 in order and throws needle::Error with
// NEEDLE_E_FORMAT (damaged / not a container) or NEEDLE_E_UNSUPPORTED (a known tag this build
// cannot run) and a message naming the field, the tensor index/name and the values.
// The result only points into the caller's bytes; it owns nothing but its own vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "container/cact_records.h"

namespace needle {

constexpr uint32_t kCactTagV2 = 0x05E12A83u;
constexpr uint32_t kCactTagOld = 0x05E12A82u;  // geometry-less predecessor (§11)
constexpr size_t kHeaderBytes = 120;

// Implementation caps (§2 notes): above them a file is refused, never allocated for.
constexpr uint32_t kMaxVocab = 1u << 16, kMaxDModel = 1u << 16, kMaxAttnWidth = 1u << 16;
constexpr uint32_t kMaxLayers = 1024, kMaxSeqLen = 1u << 20, kMaxLanes = 64;
constexpr uint32_t kMaxHeads = 1u << 12, kMaxHeadDim = 1u << 12;
constexpr uint32_t kMaxEngramSubDim = 1u << 16, kMaxEngramTables = 1u << 10;
constexpr uint32_t kMaxEngramTaps = 64;
// n-gram orders (= the tap dilation) size the token history an engram site looks back over.
constexpr uint32_t kMaxEngramOrder = 1024;

// Header fields, §2 (names as in the spec).
struct HeaderV2 {
    uint32_t tag, num_tensors, codebook_len, kv_window, kv_bits;
    uint32_t vocab_size, d_model, num_heads, num_kv_heads, num_layers, head_dim, max_seq_len;
    uint32_t hada_n, mhc_lanes;
    uint32_t engram_slots, engram_sub_dim, num_engram_tables, engram_conv_taps;
    uint32_t engram_conv_dilation, num_engram_orders, engram_orders[4];
    uint32_t num_engram_sites, engram_sites[4];
    float rope_theta;
};

enum class ProbeHeadKind : uint32_t { Contrastive = 1, Confidence = 2 };

struct ProbeHeadRecords {
    ProbeHeadKind kind;
    uint32_t probes, proj, bias;  // record indices
};

// Canonical tensor positions, §5.
struct CanonV2 {
    uint32_t layers, sites;
    static constexpr uint32_t kPerLayer = 14;
    uint32_t embedding() const { return 0; }
    uint32_t layer(uint32_t l) const { return 1 + kPerLayer * l; }  // + slot 0..13
    uint32_t mhc() const { return 1 + kPerLayer * layers; }         // + 0..8
    uint32_t engram(uint32_t s) const { return mhc() + 9 + 4 * s; } // + 0..3
    uint32_t final_norm() const { return mhc() + 9 + 4 * sites; }
};

// Slots inside one layer's 14 records (§5.1).
enum LayerSlot : uint32_t {
    kNormIn = 0, kQProj, kKProj, kVProj, kQNorm, kKNorm, kGateProj, kOutProj, kPostNorm,
    kAttnGate, kPreHada, kD1, kD2, kD3
};
enum MhcSlot : uint32_t { kAPre = 0, kAPost, kARes, kBPre, kBPost, kBRes, kPhiPre, kPhiPost, kPhiRes };
enum EngramSlot : uint32_t { kTables = 0, kKeyProj, kValueProj, kTaps };

struct ContainerV2 {
    HeaderV2 header;
    float codebook[kCodebookLen];     // 2-bit [0,4), 3-bit [4,12), 4-bit [12,28)
    std::vector<TensorRecord> tensors;
    CanonV2 canon;
    uint32_t group = 0;               // the one CQ group size of the file (§6)
    std::vector<ProbeHeadRecords> heads;  // in manifest order
    const uint8_t *tokenizer = nullptr;   // RAW blob (not yet parsed), or null
    uint64_t tokenizer_bytes = 0;
    uint64_t file_bytes = 0;
};

// Validates and indexes `size` bytes at `data` (any alignment). Throws needle::Error.
ContainerV2 parse_cact_v2(const uint8_t *data, size_t size);

// Canonical name of record `index` ("layer01.k_proj", "engram0.tables", "final_norm", ...),
// for messages. Works on a partially known canon (only geometry is needed).
std::string tensor_name(const CanonV2 &canon, uint32_t index, uint32_t num_tensors);

}  // namespace needle
