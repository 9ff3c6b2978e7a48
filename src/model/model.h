// Model-independent engine objects behind the C handles: the container bytes, a loaded model,
// one sequence's state and prefill scratch. Needle 2 (needle2.cpp) implements them; Needle 3
// plugs in a different forward pass behind the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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
    // Hands the whole pages inside [p, p + n) of a mapped file back to the page cache (they
    // leave this process's RSS and are read again from the file if touched); a no-op for
    // copied bytes. For weights whose copy the kernels made at load (kernels.h CqBlockStore).
    void release_pages(const uint8_t *p, size_t n) const;

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
    // Needle 3 additions (issue 8); v2 reports out_vocab = vocab_size and zeros.
    uint32_t out_vocab = 0;          // logits rows
    uint64_t global_layer_mask = 0;  // bit l: layer l (as run) attends globally
    uint32_t qkv_conv_taps = 0;
    bool has_confidence_head = false, has_contrastive_head = false;
};

// Element type of a sequence's KV cache (model-v2.md §4.4).
enum class KvType { F32, INT8 };

// How a sequence is created: kv_window -1 = the model's default, 0 = full causal, > 0 = that
// window (tokens); kv_type INT8 stores each K/V row as int8 plus one f32 scale (not bit-faithful).
// sink_tokens L (tool-calling.md §10.3): key j is visible to query p iff j <= p and
// (p - j < window or j < L); the ring never overwrites the L sink slots. 0 = no sinks.
// probe_heads: pool the probe-head cells (model-v2.md §7) while positions are fed, when the model
// has heads; the head window is then the state's attention (window and sinks).
// max_tokens 0 = the model's max_seq_len; else the KV memory is sized for that many positions
// at creation and feeding past it is refused (Sequence::limit).
struct SequenceOptions {
    int32_t kv_window = -1;
    KvType kv_type = KvType::F32;
    uint32_t sink_tokens = 0;
    bool probe_heads = true;
    uint32_t max_tokens = 0;
};

// One contiguous piece of a sequence's mutable memory, for copy / save / load: `bytes` in all,
// of which the first `used` matter at the position asked for (the rest is never read).
struct StateSpan {
    uint8_t *data;
    size_t bytes, used;
};
using StateVisitor = void (*)(void *ctx, const StateSpan &span);

// One sequence: position and whatever per-position memory the model keeps (KV ring, ...).
class Sequence {
public:
    virtual ~Sequence() = default;
    virtual void reset() = 0;  // back to position 0
    uint32_t pos = 0;          // next position to write = tokens fed so far
    uint32_t limit = 0;        // positions this sequence holds (max_tokens or max_seq_len)
    // The options it was made with, kv_window resolved (effective window, 0 = full causal) and
    // sink_tokens / probe_heads as they apply (0 / false when the model has no use for them).
    SequenceOptions options;
    // Calls fn for every span of its memory, in a fixed order, `used` computed for position
    // `at`. Two sequences of one model with equal options get the same spans (copy, save, load).
    // The default: a model that cannot persist its state (Error UNSUPPORTED).
    virtual void visit_state(uint32_t at, StateVisitor fn, void *ctx);
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

enum class ProbeHead : uint32_t { Contrastive = 1, Confidence = 2 };

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
    // One decode step of n sequences at once (needle_decode_many): tokens[i] at seqs[i]->pos,
    // each advanced by one; workspace row i holds sequence i, so each weight group is decoded
    // once for all of them while attention and the other histories stay per sequence. Per
    // sequence the same bits as forward() with one token. Preconditions (checked by the caller):
    // 1 <= n <= ws.capacity, distinct sequences of this model each below its limit, tokens <
    // vocab_size. logits: null, or n non-null buffers of out_vocab floats. Allocates nothing.
    virtual void forward_many(Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
                              float *const *logits) const = 0;

    int n_threads() const { return n_threads_; }  // as loaded: clamp_threads() of the request

    // Probe heads (model-v2.md §7, model-v3.md §2.4), pooled online while a sequence is fed.
    // Width of head h's output (confidence 1, contrastive its embedding dim); 0 = no such head.
    virtual uint32_t probe_head_dim(ProbeHead h) const { (void)h; return 0; }
    // out[probe_head_dim(h)] = proj · pooled + bias of head h over every non-PAD position fed
    // to seq (the raw output: the caller takes σ or the unit vector, §7.3). Throws Error
    // UNSUPPORTED without the head or when seq does not pool, INVALID_ARGUMENT when no
    // position has been pooled yet. Allocates nothing.
    virtual void probe_head_output(const Sequence &seq, ProbeHead h, float *out) const;
    // sigma(confidence head) over every position fed so far, pooled online: what
    // needle_state_confidence reports. Returns false when the model has no confidence head; true
    // with *p set otherwise. Throws as probe_head_output. The default takes σ of
    // probe_head_output; a model with its own confidence path (Needle 3) may override it.
    virtual bool confidence(const Sequence &seq, float *p) const;

    // The stored bytes of head h's tensors as in the container (probes, proj, bias), for
    // fingerprints of what was computed with it (tool index, tool-calling.md §9); empty
    // without the head. They live as long as the model.
    struct ByteSpan {
        const uint8_t *data;
        size_t size;
    };
    virtual std::vector<ByteSpan> probe_head_tensors(ProbeHead h) const { (void)h; return {}; }

    // 64-bit hash of the container bytes (state blobs are tied to it); computed on first use.
    uint64_t fingerprint() const;


protected:
    ModelInfo info_;
    int n_threads_ = 0;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::shared_ptr<const FileBytes> file_;  // the container, for fingerprint()

private:
    mutable std::once_flag fingerprint_once_;
    mutable uint64_t fingerprint_ = 0;
};

struct LoadOptions {
    bool use_mmap = true;
    int n_threads = 0;  // the C shim passes clamp_threads(needle_model_params.n_threads)
    uint32_t depth = 0; // Needle 3 ladder rung (model-v3.md §5): 0 = all layers
    bool fast = false;  // NEEDLE_PRECISION_FAST: int8-activation CQ matmuls (cq_fast.h)
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
// Model::forward_many inside the first sequence's task arena (all share the model's thread count).
void feed_many(const Model &m, Sequence *const *seqs, Workspace &ws, const uint32_t *tokens, uint32_t n,
               float *const *logits);
}  // namespace needle
