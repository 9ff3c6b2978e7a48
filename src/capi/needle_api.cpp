// The C ABI shim: translates handles and statuses, validates every argument before anything
// is mutated, and lets no exception cross the boundary. Engine logic lives in src/model,
// src/tokenizer and src/generate.
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "capi/handles.h"
#include "core/arena_pool.h"
#include "core/error.h"
#include "generate/generate.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "needle.h"

using needle::Error;

namespace {

thread_local char t_last_error[1024] = "";

needle_status set_error(needle_status code, const char *msg) {
    std::snprintf(t_last_error, sizeof t_last_error, "%s", msg);
    return code;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
needle_status errorf(needle_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
    va_end(ap);
    return code;
}

// Runs `f` and maps every exception to a status and message.
template <class F>
needle_status guarded(F &&f) noexcept {
    try {
        return f();
    } catch (const Error &e) {
        return set_error(e.code(), e.what());
    } catch (const std::bad_alloc &) {
        return set_error(NEEDLE_E_NO_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return errorf(NEEDLE_E_INTERNAL, "internal error: %s", e.what());
    } catch (...) {
        return set_error(NEEDLE_E_INTERNAL, "internal error: unknown exception");
    }
}

// Shared rules of decode and prefill, in needle.h's order (Errors): arguments (the tokens
// pointer, the ids), the logits buffer, room. The ids are read only when all n fit in the room
// (or n is 1): n is the caller's claim of its array's length, and a wrong one (SIZE_MAX) must
// fail as CONTEXT_FULL without a read past the caller's array.
needle_status check_feed(const char *fn, const needle_state *s, const uint32_t *tokens, size_t n,
                         const float *logits, size_t logits_len) {
    const needle::ModelInfo &mi = s->model->info();
    if (n > 0 && !tokens) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: tokens is NULL", fn);
    const uint32_t limit = s->seq->limit;
    const bool fits = n <= size_t(limit - s->seq->pos);
    // One id is always there to read (decode passes its by-value token), so a full state still
    // reports a bad one first.
    for (size_t i = 0; (fits || n == 1) && i < n; ++i)
        if (tokens[i] >= mi.vocab_size)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: token %u at index %zu is >= vocab_size %u",
                          fn, tokens[i], i, mi.vocab_size);
    if (!logits && logits_len > 0)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: logits is NULL but logits_len is %zu", fn, logits_len);
    if (logits && logits_len < mi.out_vocab)
        return errorf(NEEDLE_E_BUFFER_TOO_SMALL, "%s: logits_len %zu < out_vocab %u (logits rows)", fn, logits_len,
                      mi.out_vocab);
    if (!fits)
        return errorf(NEEDLE_E_CONTEXT_FULL, "%s: %zu token%s at position %u would pass the state's %s %u",
                      fn, n, needle::plural(n), s->seq->pos, limit < mi.max_seq_len ? "max_tokens" : "max_seq_len",
                      limit);
    return NEEDLE_OK;
}

// The refusal of a call on a state whose needle_generate is running (from its own callback).
needle_status busy_error(const char *fn) {
    return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: state is busy in needle_generate (called from its token callback)", fn);
}

// Defaults of the params structs (needle.h), and where each struct's fields end: the first entry
// is the end of its first layout (older callers), the later ones the fields appended since.
needle_model_params model_params_defaults() {
    return needle::capi::params_defaults<needle_model_params>([](needle_model_params &d) {
        d.use_mmap = 1, d.n_threads = 0, d.depth = 0, d.precision = NEEDLE_PRECISION_EXACT;
    });
}
constexpr size_t kModelParamsV1 = NEEDLE_FIELD_END(needle_model_params, n_threads);

needle_state_params state_params_defaults() {
    return needle::capi::params_defaults<needle_state_params>([](needle_state_params &d) {
        d.kv_window = -1, d.kv_type = NEEDLE_KV_F32, d.max_tokens = 0, d.probe_heads = 1;
    });
}
constexpr size_t kStateParamsV1 = NEEDLE_FIELD_END(needle_state_params, kv_window);

needle_generate_params generate_params_defaults() {
    return needle::capi::params_defaults<needle_generate_params>([](needle_generate_params &d) {
        d.max_tokens = 128, d.temperature = 0.0f, d.top_k = 0, d.top_p = 1.0f, d.seed = 0, d.add_bos = 1;
    });
}

template <class T>
bool struct_ok(const T *p, size_t min_size) {
    return p && p->struct_size >= min_size;
}

// Validates load params, then opens the bytes with `open` and builds the model.
template <class Open>
needle_status load_common(const char *fn, const needle_model_params *p, needle_model **out, Open &&open) {
    needle_model_params params = model_params_defaults();
    if (p) {
        // The first layout ended after n_threads; later fields keep their defaults for it.
        const size_t v1 = kModelParamsV1;
        if (p->struct_size < v1)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: params.struct_size %u < %zu"
                          " (call needle_model_params_init)", fn, p->struct_size, v1);
        if (p->use_mmap != 0 && p->use_mmap != 1)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: use_mmap %d (use 0 read or 1 map)", fn, p->use_mmap);
        if (p->n_threads < 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: n_threads %d is negative", fn, p->n_threads);
        params.use_mmap = p->use_mmap, params.n_threads = p->n_threads;
        if (p->struct_size >= offsetof(needle_model_params, depth) + sizeof p->depth) params.depth = p->depth;
        if (p->struct_size >= NEEDLE_FIELD_END(needle_model_params, precision)) params.precision = p->precision;
        if (params.precision != NEEDLE_PRECISION_EXACT && params.precision != NEEDLE_PRECISION_FAST)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: precision %d is not a needle_precision", fn, params.precision);
    }
    return guarded([&] {
        needle::LoadOptions opt;
        opt.use_mmap = params.use_mmap != 0;
        opt.n_threads = needle::clamp_threads(params.n_threads);  // never the raw count (needle.h)
        opt.depth = params.depth;
        opt.fast = params.precision == NEEDLE_PRECISION_FAST;
        auto h = std::make_unique<needle_model>();
        h->m = needle::load_model(open(opt), opt);
        *out = h.release();
        return NEEDLE_OK;
    });
}

}  // namespace

needle_status needle::capi::set_last_error(needle_status code, const char *msg) { return set_error(code, msg); }

extern "C" {

uint32_t needle_abi_version(void) { return NEEDLE_ABI_VERSION; }

const char *needle_version_string(void) { return NEEDLE_VERSION_STRING; }

const char *needle_kernel_isa(void) {
    try {
        return needle::kernel_isa();
    } catch (...) {
        return "scalar";
    }
}

const char *needle_kernel_isa_requested(void) {
    try {
        return needle::kernel_isa_requested();
    } catch (...) {
        return "";
    }
}

int32_t needle_check_abi(uint32_t expected_abi) {
    if (expected_abi == NEEDLE_ABI_VERSION) return NEEDLE_OK;
    return errorf(NEEDLE_E_UNSUPPORTED, "caller expects needle ABI %u, library implements ABI %u",
                  expected_abi, unsigned(NEEDLE_ABI_VERSION));
}

const char *needle_status_string(needle_status s) {
    switch (s) {
    case NEEDLE_OK: return "ok";
    case NEEDLE_E_INVALID_ARGUMENT: return "invalid argument";
    case NEEDLE_E_IO: return "i/o error";
    case NEEDLE_E_FORMAT: return "invalid or damaged model file or saved state";
    case NEEDLE_E_UNSUPPORTED: return "unsupported";
    case NEEDLE_E_NO_MEMORY: return "out of memory";
    case NEEDLE_E_CONTEXT_FULL: return "context full";
    case NEEDLE_E_BUFFER_TOO_SMALL: return "buffer too small";
    case NEEDLE_E_CANCELLED: return "cancelled";
    case NEEDLE_E_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

const char *needle_last_error(void) { return t_last_error; }

void needle_model_params_init(needle_model_params *p) {
    needle::capi::init_params(p, model_params_defaults(), {kModelParamsV1, NEEDLE_FIELD_END(needle_model_params, depth),
                                                                   NEEDLE_FIELD_END(needle_model_params, precision)});
}

}  // extern "C"

namespace needle {
namespace capi {
needle_status load_memory(const char *fn, const void *data, size_t size, const needle_model_params *p,
                          needle_model **out) {
    if (out) *out = nullptr;
    if (!out || (!data && size > 0)) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: data or out is NULL", fn);
    return load_common(fn, p, out, [&](const needle::LoadOptions &) {
        static const uint8_t empty = 0;
        return needle::FileBytes::copy(data ? data : &empty, size);
    });
}
}  // namespace capi
}  // namespace needle

extern "C" {

needle_status needle_model_load_file(const char *path, const needle_model_params *p, needle_model **out) {
    if (out) *out = nullptr;
    if (!path || !out) return set_error(NEEDLE_E_INVALID_ARGUMENT, "needle_model_load_file: path or out is NULL");
    return load_common("needle_model_load_file", p, out, [&](const needle::LoadOptions &o) {
        return needle::FileBytes::open(path, o.use_mmap);
    });
}

needle_status needle_model_load_memory(const void *data, size_t size, const needle_model_params *p,
                                       needle_model **out) {
    return needle::capi::load_memory("needle_model_load_memory", data, size, p, out);
}

void needle_model_free(needle_model *model) { delete model; }

needle_status needle_model_get_info(const needle_model *model, needle_model_info *info) {
    const size_t v1 = offsetof(needle_model_info, file_bytes) + sizeof(uint64_t);
    if (!model || !info) return set_error(NEEDLE_E_INVALID_ARGUMENT, "needle_model_get_info: model or info is NULL");
    if (info->struct_size < v1)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_model_get_info: struct_size %u < %zu", info->struct_size, v1);
    const needle::ModelInfo &mi = model->m->info();
    needle_model_info r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = info->struct_size;
    r.format_version = mi.format_version, r.vocab_size = mi.vocab_size, r.d_model = mi.d_model;
    r.num_layers = mi.num_layers, r.num_heads = mi.num_heads, r.num_kv_heads = mi.num_kv_heads;
    r.head_dim = mi.head_dim, r.v_head_dim = mi.v_head_dim, r.max_seq_len = mi.max_seq_len;
    r.kv_window = mi.kv_window, r.mhc_lanes = mi.mhc_lanes, r.num_engram_sites = mi.num_engram_sites;
    r.bos_id = mi.bos_id, r.eos_id = mi.eos_id, r.pad_id = mi.pad_id, r.unk_id = mi.unk_id;
    r.has_tokenizer = model->m->tokenizer() != nullptr;
    r.weight_bytes = mi.weight_bytes, r.file_bytes = mi.file_bytes;
    r.out_vocab = mi.out_vocab, r.global_layer_mask = mi.global_layer_mask, r.qkv_conv_taps = mi.qkv_conv_taps;
    r.has_confidence_head = mi.has_confidence_head, r.has_contrastive_head = mi.has_contrastive_head;
    r.n_threads = uint32_t(model->m->n_threads());
    std::memcpy(info, &r, std::min<size_t>(info->struct_size, sizeof r));
    return NEEDLE_OK;
}

void needle_state_params_init(needle_state_params *p) {
    needle::capi::init_params(p, state_params_defaults(),
                              {kStateParamsV1, NEEDLE_FIELD_END(needle_state_params, kv_type),
                               NEEDLE_FIELD_END(needle_state_params, max_tokens),
                               NEEDLE_FIELD_END(needle_state_params, probe_heads)});
}

needle_status needle_state_create_ex(needle_model *model, const needle_state_params *p, needle_state **out) {
    if (out) *out = nullptr;
    if (!model || !out) return set_error(NEEDLE_E_INVALID_ARGUMENT, "needle_state_create_ex: model or out is NULL");
    needle_state_params params = state_params_defaults();
    if (p) {
        // The first layout ended after kv_window; later fields keep their defaults for it.
        const size_t v1 = kStateParamsV1;
        if (p->struct_size < v1)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_state_create_ex: params.struct_size %u < %zu"
                          " (call needle_state_params_init)", p->struct_size, v1);
        // Whole fields only: a size that ends inside kv_type is the first layout too.
        params.kv_window = p->kv_window;
        if (p->struct_size >= offsetof(needle_state_params, kv_type) + sizeof p->kv_type) params.kv_type = p->kv_type;
        if (p->struct_size >= offsetof(needle_state_params, max_tokens) + sizeof p->max_tokens)
            params.max_tokens = p->max_tokens;
        if (p->struct_size >= NEEDLE_FIELD_END(needle_state_params, probe_heads)) params.probe_heads = p->probe_heads;
    }
    if (params.kv_window < -1)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_state_create_ex: kv_window %d (use -1, 0 or > 0)", params.kv_window);
    if (params.kv_type != NEEDLE_KV_F32 && params.kv_type != NEEDLE_KV_INT8)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_state_create_ex: kv_type %d (use NEEDLE_KV_F32 0 or NEEDLE_KV_INT8 1)",
                      params.kv_type);
    if (params.probe_heads != 0 && params.probe_heads != 1)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_state_create_ex: probe_heads %d (use 1 pool or 0 skip)",
                      params.probe_heads);
    return guarded([&] {
        auto s = std::make_unique<needle_state>();
        s->model = model->m;
        needle::SequenceOptions so;
        so.kv_window = params.kv_window;
        so.kv_type = params.kv_type == NEEDLE_KV_INT8 ? needle::KvType::INT8 : needle::KvType::F32;
        so.max_tokens = params.max_tokens;
        so.probe_heads = params.probe_heads != 0;
        s->seq = s->model->new_sequence(so);
        s->step = s->model->new_workspace(1);
        s->gen = std::make_unique<needle::Generator>(*s->model);
        *out = s.release();
        return NEEDLE_OK;
    });
}

needle_status needle_state_create(needle_model *model, needle_state **out) {
    return needle_state_create_ex(model, nullptr, out);
}

void needle_state_free(needle_state *state) {
    if (state && state->busy) {
        state->free_pending = true;  // freed when its needle_generate returns
        return;
    }
    delete state;
}

void needle_state_reset(needle_state *state) {
    if (!state) return;
    if (state->busy) {
        busy_error("needle_state_reset");  // ignored: the sequence stays as generate left it
        return;
    }
    state->seq->reset();
}

uint32_t needle_state_pos(const needle_state *state) { return state ? state->seq->pos : 0; }


needle_status needle_batch_create(needle_model *model, uint32_t capacity, needle_batch **out) {
    if (out) *out = nullptr;
    if (!model || !out) return set_error(NEEDLE_E_INVALID_ARGUMENT, "needle_batch_create: model or out is NULL");
    const uint32_t tmax = model->m->info().max_seq_len;
    if (capacity == 0 || capacity > tmax)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_batch_create: capacity %u not in 1..max_seq_len %u",
                      capacity, tmax);
    return guarded([&] {
        auto b = std::make_unique<needle_batch>();
        b->model = model->m;
        b->ws = b->model->new_workspace(capacity);
        b->seqs.resize(capacity);
        *out = b.release();
        return NEEDLE_OK;
    });
}

void needle_batch_free(needle_batch *batch) { delete batch; }

needle_status needle_state_decode(needle_state *state, uint32_t token, float *logits, size_t logits_len) {
    if (!state) return set_error(NEEDLE_E_INVALID_ARGUMENT, "needle_state_decode: state is NULL");
    if (state->busy) return busy_error("needle_state_decode");
    const needle_status st = check_feed("needle_state_decode", state, &token, 1, logits, logits_len);
    if (st != NEEDLE_OK) return st;
    return guarded([&] {
        needle::feed(*state->model, *state->seq, *state->step, &token, 1, logits);
        return NEEDLE_OK;
    });
}

needle_status needle_state_prefill(needle_state *state, needle_batch *batch, const uint32_t *tokens,
                                   size_t n_tokens, float *logits, size_t logits_len) {
    const char *fn = "needle_state_prefill";
    if (!state) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: state is NULL", fn);
    if (state->busy) return busy_error(fn);
    if (batch && batch->model != state->model)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: the batch was made for another model", fn);
    if (n_tokens == 0 && (logits || logits_len))
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: 0 tokens give no logits", fn);
    const needle_status st = check_feed(fn, state, tokens, n_tokens, logits, logits_len);
    if (st != NEEDLE_OK || n_tokens == 0) return st;
    return guarded([&] {
        needle::feed(*state->model, *state->seq, batch ? *batch->ws : *state->step, tokens, n_tokens, logits);
        return NEEDLE_OK;
    });
}

needle_status needle_decode_many(needle_state *const *states, const uint32_t *tokens, size_t n,
                                 float *const *logits, size_t logits_len, needle_batch *scratch) {
    const char *fn = "needle_decode_many";
    if (!states || !tokens || !scratch)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: states, tokens or scratch is NULL", fn);
    if (n == 0 || n > scratch->ws->capacity)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: n %zu is not within 1..%u (the batch's capacity)", fn, n,
                      scratch->ws->capacity);
    const needle::Model &m = *scratch->model;
    // INVALID_ARGUMENT first (all states), then the buffers, then room (needle.h, Errors).
    for (size_t i = 0; i < n; ++i) {
        const needle_state *s = states[i];
        if (!s) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: states[%zu] is NULL", fn, i);
        if (s->busy) return busy_error(fn);
        if (s->model.get() != &m)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: states[%zu] is of another model than the batch", fn, i);
        for (size_t j = 0; j < i; ++j)  // n <= capacity: quadratic is a few thousand compares at most
            if (states[j] == s)
                return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: states[%zu] and states[%zu] are the same state", fn, j, i);
        if (tokens[i] >= m.info().vocab_size)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: token %u at index %zu is >= vocab_size %u", fn, tokens[i],
                          i, m.info().vocab_size);
    }
    if (!logits && logits_len > 0)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: logits is NULL but logits_len is %zu", fn, logits_len);
    if (logits)
        for (size_t i = 0; i < n; ++i)
            if (!logits[i]) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: logits[%zu] is NULL", fn, i);
    if (logits && logits_len < m.info().out_vocab)
        return errorf(NEEDLE_E_BUFFER_TOO_SMALL, "%s: logits_len %zu < out_vocab %u (logits rows)", fn, logits_len,
                      m.info().out_vocab);
    for (size_t i = 0; i < n; ++i) {
        const needle::Sequence &q = *states[i]->seq;
        if (q.pos >= q.limit)
            return errorf(NEEDLE_E_CONTEXT_FULL, "%s: states[%zu] is full (position %u, %s %u)", fn, i, q.pos,
                          q.limit < m.info().max_seq_len ? "max_tokens" : "max_seq_len", q.limit);
    }
    // The Sequence pointers go in the batch's own list: the call allocates nothing.
    return guarded([&] {
        std::vector<needle::Sequence *> &seqs = scratch->seqs;
        for (size_t i = 0; i < n; ++i) seqs[i] = states[i]->seq.get();
        needle::feed_many(m, seqs.data(), *scratch->ws, tokens, uint32_t(n), logits);
        return NEEDLE_OK;
    });
}

needle_status needle_model_tokenize(const needle_model *model, const char *text, size_t text_len, int add_bos,
                                    uint32_t *tokens, size_t capacity, size_t *n_tokens) {
    const char *fn = "needle_model_tokenize";
    if (!model || !n_tokens) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: model or n_tokens is NULL", fn);
    if (!text && text_len > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: text is NULL", fn);
    if (!tokens && capacity > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: tokens is NULL", fn);
    const needle::Tokenizer *tok = model->m->tokenizer();
    if (!tok) return errorf(NEEDLE_E_UNSUPPORTED, "%s: this model has no tokenizer", fn);
    return guarded([&] {
        std::vector<uint32_t> ids;
        if (add_bos) ids.push_back(tok->bos_id());
        tok->encode(std::string_view(text ? text : "", text_len), ids);
        *n_tokens = ids.size();
        if (ids.size() > capacity)
            return errorf(NEEDLE_E_BUFFER_TOO_SMALL, "%s: %zu token%s do%s not fit capacity %zu", fn, ids.size(),
                          needle::plural(ids.size()), ids.size() == 1 ? "es" : "", capacity);
        std::copy(ids.begin(), ids.end(), tokens);
        return NEEDLE_OK;
    });
}

needle_status needle_model_detokenize(const needle_model *model, const uint32_t *tokens, size_t n_tokens, char *text,
                                      size_t capacity, size_t *text_len) {
    const char *fn = "needle_model_detokenize";
    if (!model || !text_len) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: model or text_len is NULL", fn);
    if (!tokens && n_tokens > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: tokens is NULL", fn);
    if (!text && capacity > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: text is NULL", fn);
    const needle::Tokenizer *tok = model->m->tokenizer();
    if (!tok) return errorf(NEEDLE_E_UNSUPPORTED, "%s: this model has no tokenizer", fn);
    for (size_t i = 0; i < n_tokens; ++i)
        if (tokens[i] >= tok->size())
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: token %u at index %zu is >= vocab_size %u", fn, tokens[i], i,
                          tok->size());
    return guarded([&] {
        const std::string s = tok->decode(tokens, n_tokens);
        *text_len = s.size();
        if (s.size() + 1 > capacity)
            return errorf(NEEDLE_E_BUFFER_TOO_SMALL, "%s: %zu byte%s + NUL do not fit capacity %zu", fn, s.size(),
                          needle::plural(s.size()), capacity);
        std::memcpy(text, s.c_str(), s.size() + 1);
        return NEEDLE_OK;
    });
}

void needle_generate_params_init(needle_generate_params *p) {
    // One layout so far: the whole struct (padding included) or nothing.
    needle::capi::init_params(p, generate_params_defaults(), {sizeof(needle_generate_params)});
}

needle_status needle_generate(needle_state *state, needle_batch *batch, const char *prompt, size_t prompt_len,
                              const needle_generate_params *params, needle_token_callback callback, void *user_data,
                              needle_generate_result *result) {
    const char *fn = "needle_generate";
    // The result is checked and cleared first, so that every later failure reports "did not
    // generate" (NEEDLE_STOP_NONE, zero counts) instead of leaving the caller's old bytes.
    if (result) {
        if (result->struct_size < sizeof(needle_generate_result))
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: result.struct_size %u < %zu", fn, result->struct_size,
                          sizeof(needle_generate_result));
        result->prompt_tokens = 0;
        result->generated_tokens = 0;
        result->stop_reason = NEEDLE_STOP_NONE;
        result->prefill_ms = 0.0;
        result->decode_ms = 0.0;
    }
    if (!state) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: state is NULL", fn);
    if (state->busy) return busy_error(fn);
    if (!prompt && prompt_len > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: prompt is NULL", fn);
    if (batch && batch->model != state->model)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: the batch was made for another model", fn);
    needle_generate_params p = generate_params_defaults();
    if (params) {
        if (params->struct_size < sizeof p)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, "%s: params.struct_size %u < %zu (call needle_generate_params_init)",
                          fn, params->struct_size, sizeof p);
        p = *params;
    }
    needle::GenerateOptions opt;
    opt.max_tokens = p.max_tokens;
    opt.sampling.temperature = p.temperature;
    opt.sampling.top_k = p.top_k;
    opt.sampling.top_p = p.top_p;
    opt.sampling.seed = p.seed;
    opt.add_bos = p.add_bos != 0;
    needle::GenerateStats stats;
    state->busy = true;
    const needle_status st = guarded([&] {
        return state->gen->run(*state->seq, *state->step, batch ? batch->ws.get() : nullptr,
                               std::string_view(prompt ? prompt : "", prompt_len), opt, callback, user_data, stats);
    });
    state->busy = false;
    if (state->free_pending) delete state;  // the callback freed it
    if (st == NEEDLE_E_CANCELLED) {
        set_error(st, "needle_generate: stopped by the callback");
    } else if (st != NEEDLE_OK) {  // the generation layer's messages name no entry point
        char msg[sizeof t_last_error];
        std::snprintf(msg, sizeof msg, "%s", t_last_error);
        errorf(st, "needle_generate: %s", msg);
    }
    if (result) {
        result->prompt_tokens = stats.prompt_tokens;
        result->generated_tokens = stats.generated_tokens;
        result->stop_reason = stats.stop_reason;
        result->prefill_ms = stats.prefill_ms;
        result->decode_ms = stats.decode_ms;
    }
    return st;
}

}  // extern "C"
