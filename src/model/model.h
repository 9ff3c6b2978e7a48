// Model-independent engine objects behind the C handles: the container bytes, a loaded model,
// one sequence's state and prefill scratch. Needle 2 (needle2.cpp) implements them; Needle 3
// plugs in a different forward pass behind the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "tokenizer/tokenizer.h"

namespace needle {

// The bytes of one container: a read-only mapping of a file, or an owned copy.
class FileBytes {
public:
    // Throws Error(NEEDLE_E_IO) when the file cannot be opened, sized, mapped or read.
    static std::shared_ptr<const FileBytes> open(const char *path, bool use_mmap);
    static std::shared_ptr<const FileBytes> copy(const void *data, size_t size);
    ~FileBytes();
    FileBytes(const FileBytes &) = delete;
    FileBytes &operator=(const FileBytes &) = delete;
    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }

private:
    FileBytes() = default;
    const uint8_t *data_ = nullptr;
    size_t size_ = 0;
    bool mapped_ = false;
    std::vector<uint8_t> owned_;
};

// Geometry and ids reported through needle_model_info.
struct ModelInfo {
    uint32_t format_version = 0;
    uint32_t vocab_size = 0, d_model = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0;
    uint32_t head_dim = 0, v_head_dim = 0, max_seq_len = 0;
    uint32_t kv_window = 0;  // effective default window; 0 = full causal
    uint32_t mhc_lanes = 0, num_engram_sites = 0;
    uint32_t bos_id = 2, eos_id = 1, pad_id = 0, unk_id = 3;
    uint64_t weight_bytes = 0, file_bytes = 0;
};

// One sequence: position and whatever per-position memory the model keeps (KV ring, ...).
class Sequence {
public:
    virtual ~Sequence() = default;
    virtual void reset() = 0;  // back to position 0
    uint32_t pos = 0;          // next position to write = tokens fed so far
    // This sequence's worker threads (sized from needle_model_params.n_threads); its own arena
    // while it lives (leased from a pool, core/arena_pool.h), so concurrent sequences never wait
    // on each other's slots, and no process-wide TBB limit.
    ArenaLease arena;
};

// Scratch for a forward pass over up to `capacity` positions at once.
class Workspace {
public:
    virtual ~Workspace() = default;
    uint32_t capacity = 0;
};

// Element type of a sequence's KV cache (model-v2.md §4.4).
enum class KvType { F32, INT8 };

// How a sequence is created: kv_window -1 = the model's default, 0 = full causal, > 0 = that
// window (tokens); kv_type INT8 stores each K/V row as int8 plus one f32 scale (not bit-faithful).
struct SequenceOptions {
    int32_t kv_window = -1;
    KvType kv_type = KvType::F32;
};

class Model {
public:
    virtual ~Model() = default;
    const ModelInfo &info() const { return info_; }
    const Tokenizer *tokenizer() const { return tokenizer_.get(); }

    // Throws Error(NEEDLE_E_INVALID_ARGUMENT) for a window the model cannot run.
    virtual std::unique_ptr<Sequence> new_sequence(const SequenceOptions &opt) const = 0;
    virtual std::unique_ptr<Workspace> new_workspace(uint32_t capacity) const = 0;

    // Feeds tokens[0..n) at seq.pos and advances it. Preconditions (checked by the caller):
    // 1 <= n <= ws.capacity, tokens < vocab_size, seq.pos + n <= max_seq_len, seq and ws made
    // by this model. logits: null, or vocab_size floats receiving the last position's logits.
    // Allocates nothing.
    virtual void forward(Sequence &seq, Workspace &ws, const uint32_t *tokens, uint32_t n,
                         float *logits) const = 0;

    int n_threads() const { return n_threads_; }  // as loaded: clamp_threads() of the request

protected:
    ModelInfo info_;
    int n_threads_ = 0;
    std::unique_ptr<Tokenizer> tokenizer_;
};

struct LoadOptions {
    bool use_mmap = true;
    int n_threads = 0;  // the C shim passes clamp_threads(needle_model_params.n_threads)
};

// Reads the tag, validates the container and builds the matching model.
// Throws Error(FORMAT / UNSUPPORTED / IO / NO_MEMORY).
std::shared_ptr<const Model> load_model(std::shared_ptr<const FileBytes> bytes, const LoadOptions &opt);

}  // namespace needle

namespace needle {
// Feeds n >= 1 tokens through `ws` in chunks of ws.capacity (same bits as one at a time), inside
// the sequence's task arena; logits of the last position if non-null. Preconditions as
// Model::forward, except n may exceed the capacity.
void feed(const Model &m, Sequence &seq, Workspace &ws, const uint32_t *tokens, size_t n,
          float *logits);
}  // namespace needle
