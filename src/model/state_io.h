// Copy, save and load of one sequence's state (issue 9 item 2): the spans of Sequence::visit_state
// behind a versioned, checksummed byte format tied to the model's fingerprint.
//
// Blob layout (all little-endian):
//   [0, 8)    magic "NDLSTAT1"
//   u32       version (1)
//   u32       model format_version (2 = Needle 2, 3 = Needle 3)
//   u64       model fingerprint (Model::fingerprint: hash of the container bytes)
//   u32 x 5   kv_window (effective), kv_type, sink_tokens, probe_heads, pos
//   u32       span count
//   per span: u64 used bytes, then those bytes
//   u64       hash64 of everything before it
// Only each span's used prefix (a function of pos) is stored, so a short sequence saves small.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/model.h"

namespace needle {

// 64-bit hash of n bytes: 8-byte words (then the tail bytes) through FNV-1a steps. Each step is
// a bijection of the running value, so any change confined to one word changes the result.
uint64_t hash64(const void *data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);

// dst takes src's position and memory. Both sequences come from `m` with equal options (the
// caller checks); allocates nothing.
void copy_sequence(Sequence &dst, const Sequence &src);

// Size of the blob of seq at its current position.
size_t saved_size(const Model &m, const Sequence &seq);
// Writes the blob into buf[cap] (cap >= saved_size).
void save_sequence(const Model &m, const Sequence &seq, uint8_t *buf, size_t cap);
// Validates the whole blob, then replaces seq's state with it. Throws Error(FORMAT) for a
// blob that is damaged, of another version, model or options; seq is unchanged then.
void load_sequence(const Model &m, Sequence &seq, const uint8_t *buf, size_t len);

}  // namespace needle
