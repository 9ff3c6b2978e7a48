// C entry points of the tool-calling chat (needle_chat_*) and of upstream's process-wide API
// (needle_load / needle_init / needle_complete / needle_reset). Translates handles, statuses and
// buffers only; the conversation lives in src/chat.
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "capi/handles.h"
#include "chat/chat.h"
#include "core/error.h"
#include "needle.h"

using needle::Error;
using needle::capi::set_last_error;

struct needle_chat {
    std::shared_ptr<const needle::Model> model;
    std::unique_ptr<needle::chat::Chat> chat;
};

namespace {

needle_status errorf(needle_status code, const char *fn, const std::string &msg) {
    const std::string m = std::string(fn) + ": " + msg;
    return set_last_error(code, m.c_str());
}

template <class F>
needle_status guarded(const char *fn, F &&f) noexcept {
    try {
        return f();
    } catch (const Error &e) {
        return errorf(e.code(), fn, e.what());
    } catch (const std::bad_alloc &) {
        return errorf(NEEDLE_E_NO_MEMORY, fn, "out of memory");
    } catch (const std::exception &e) {
        return errorf(NEEDLE_E_INTERNAL, fn, std::string("internal error: ") + e.what());
    } catch (...) {
        return errorf(NEEDLE_E_INTERNAL, fn, "internal error: unknown exception");
    }
}

// Copies `s` + NUL when it fits; else writes nothing and reports BUFFER_TOO_SMALL.
needle_status copy_out(const char *fn, const std::string &s, char *out, size_t cap, size_t *len) {
    *len = s.size();
    if (s.size() + 1 > cap)
        return errorf(NEEDLE_E_BUFFER_TOO_SMALL, fn, std::to_string(s.size()) + " bytes + NUL do not fit capacity " +
                                                         std::to_string(cap));
    std::memcpy(out, s.c_str(), s.size() + 1);
    return NEEDLE_OK;
}

// §7.2: the envelope, or the minimal buffer_too_small one, or "" (cap >= 1).
needle_status write_envelope_out(const char *fn, const std::string &env, char *out, size_t cap, size_t *len) {
    if (len) *len = env.size();
    if (env.size() + 1 <= cap) {
        std::memcpy(out, env.c_str(), env.size() + 1);
        return NEEDLE_OK;
    }
    const std::string small = needle::chat::buffer_too_small_envelope(env.size() + 1);
    if (small.size() + 1 <= cap) std::memcpy(out, small.c_str(), small.size() + 1);
    else out[0] = '\0';
    return errorf(NEEDLE_E_BUFFER_TOO_SMALL, fn, "the envelope of " + std::to_string(env.size()) +
                                                     " bytes + NUL does not fit capacity " + std::to_string(cap));
}

needle::chat::ChatOptions options_of(const needle_chat_params &p) {
    needle::chat::ChatOptions o;
    o.tool_choice = needle::chat::ToolChoice(p.tool_choice);
    o.kv_type = p.kv_type == NEEDLE_KV_INT8 ? needle::KvType::INT8 : needle::KvType::F32;
    o.grammar = p.grammar != 0;
    o.require_required = p.require_required != 0;
    o.stop_needs_call = p.stop_needs_call != 0;
    o.sinks = p.sinks != 0;
    o.validation = needle::chat::ValidationMode(p.validation);
    o.retrieval_k = NEEDLE_CHAT_RETRIEVAL_K;
    if (p.tool_index_path) o.tool_index_path = p.tool_index_path;  // copied: the caller may free it
    return o;
}

needle_chat_params chat_params_defaults() {
    return needle::capi::params_defaults<needle_chat_params>([](needle_chat_params &d) {
        d.tool_choice = NEEDLE_TOOL_CHOICE_AUTO, d.kv_type = NEEDLE_KV_F32;
        d.grammar = 1, d.require_required = 1, d.stop_needs_call = 1, d.sinks = 1;
        d.validation = NEEDLE_VALIDATION_OFF;
        d.tool_index_path = nullptr;
    });
}
// The first layout ended after stop_needs_call; sinks, validation, then tool_index_path were
// appended. The end
// offsets of every layout, for init and read alike (whole fields only: a pointer may follow).
constexpr size_t kChatParamsV1 = NEEDLE_FIELD_END(needle_chat_params, stop_needs_call);
#define NEEDLE_CHAT_FIELD_ENDS \
    { kChatParamsV1, NEEDLE_FIELD_END(needle_chat_params, sinks), NEEDLE_FIELD_END(needle_chat_params, validation), \
      NEEDLE_FIELD_END(needle_chat_params, tool_index_path) }

needle_status read_params(const char *fn, const needle_chat_params *p, needle_chat_params &out) {
    out = chat_params_defaults();
    if (!p) return NEEDLE_OK;
    const size_t v1 = kChatParamsV1;
    if (p->struct_size < v1)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "params.struct_size " + std::to_string(p->struct_size) +
                                                         " is too small (call needle_chat_params_init)");
    // Whole fields up to the caller's struct_size; later ones keep their defaults.
    const size_t n = needle::capi::whole_field_bytes(p->struct_size, NEEDLE_CHAT_FIELD_ENDS);
    std::memcpy(reinterpret_cast<char *>(&out) + sizeof(uint32_t), reinterpret_cast<const char *>(p) + sizeof(uint32_t),
                n - sizeof(uint32_t));
    out.struct_size = sizeof out;
    if (out.tool_choice < 0 || out.tool_choice > 2)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "tool_choice " + std::to_string(out.tool_choice) +
                                                         " (use 0 auto, 1 required, 2 none)");
    const std::pair<const char *, int32_t> flags[] = {{"grammar", out.grammar},
                                                      {"require_required", out.require_required},
                                                      {"stop_needs_call", out.stop_needs_call},
                                                      {"sinks", out.sinks}};
    for (const auto &f : flags)  // 0 or 1: another value is more likely a misplaced field than "on"
        if (f.second != 0 && f.second != 1)
            return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, std::string(f.first) + " " + std::to_string(f.second) +
                                                             " (use 0 off or 1 on)");
    if (out.kv_type != NEEDLE_KV_F32 && out.kv_type != NEEDLE_KV_INT8)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "kv_type " + std::to_string(out.kv_type) + " (use 0 f32 or 1 int8)");
    if (out.validation < NEEDLE_VALIDATION_OFF || out.validation > NEEDLE_VALIDATION_ANNOTATE)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "validation " + std::to_string(out.validation) +
                                                         " (use 0 off, 1 suppress, 2 annotate)");
    return NEEDLE_OK;
}

needle_status create_chat(const char *fn, std::shared_ptr<const needle::Model> model, const char *system,
                          const char *tools_json, const needle_chat_params &p, needle_chat **out) {
    return guarded(fn, [&] {
        auto h = std::make_unique<needle_chat>();
        h->model = model;
        h->chat = std::make_unique<needle::chat::Chat>(model, system ? system : "", tools_json ? tools_json : "[]",
                                                       options_of(p));
        *out = h.release();
        return NEEDLE_OK;
    });
}

}  // namespace

extern "C" {

void needle_chat_params_init(needle_chat_params *p) {
    needle::capi::init_params(p, chat_params_defaults(), NEEDLE_CHAT_FIELD_ENDS);
}

needle_status needle_chat_create(needle_model *model, const char *system, const char *tools_json,
                                 const needle_chat_params *p, needle_chat **out) {
    const char *fn = "needle_chat_create";
    if (out) *out = nullptr;
    if (!model || !out) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "model or out is NULL");
    needle_chat_params params;
    const needle_status st = read_params(fn, p, params);
    if (st != NEEDLE_OK) return st;
    return create_chat(fn, model->m, system, tools_json, params, out);
}

needle_status needle_chat_render(needle_chat *chat, const char *text, char *out, size_t cap, size_t *len) {
    const char *fn = "needle_chat_render";
    if (!chat || !text || !len) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "chat, text or len is NULL");
    if (!out && cap > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "out is NULL");
    return guarded(fn, [&] { return copy_out(fn, chat->chat->render(text), out, cap, len); });
}

needle_status needle_chat_complete(needle_chat *chat, const char *text, uint32_t max_new_tokens, char *out,
                                   size_t cap, size_t *len) {
    const char *fn = "needle_chat_complete";
    if (len) *len = 0;
    if (!chat || !text || !out) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "chat, text or out is NULL");
    if (cap < 2) {
        if (cap == 1) out[0] = '\0';
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "cap " + std::to_string(cap) + " is below 2 bytes");
    }
    if (max_new_tokens == 0) {
        out[0] = '\0';
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "max_new_tokens is 0");
    }
    const needle_status st = guarded(fn, [&] {
        return write_envelope_out(fn, chat->chat->complete(text, max_new_tokens), out, cap, len);
    });
    if (st != NEEDLE_OK && st != NEEDLE_E_BUFFER_TOO_SMALL) out[0] = '\0';
    return st;
}

void needle_chat_reset(needle_chat *chat) {
    if (chat) chat->chat->reset();
}

void needle_chat_free(needle_chat *chat) { delete chat; }

needle_status needle_chat_tools_json(const needle_chat *chat, char *out, size_t cap, size_t *len) {
    const char *fn = "needle_chat_tools_json";
    if (!chat || !len) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "chat or len is NULL");
    if (!out && cap > 0) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "out is NULL");
    return guarded(fn, [&] { return copy_out(fn, chat->chat->tools_canonical(), out, cap, len); });
}

needle_status needle_chat_static_prefix_tokens(const needle_chat *chat, uint32_t *n_tokens) {
    if (!chat || !n_tokens)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, "needle_chat_static_prefix_tokens", "chat or n_tokens is NULL");
    *n_tokens = chat->chat->static_prefix_tokens();
    return NEEDLE_OK;
}

needle_status needle_chat_last_stats(const needle_chat *chat, needle_chat_stats *stats) {
    const char *fn = "needle_chat_last_stats";
    if (!chat || !stats) return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "chat or stats is NULL");
    if (stats->struct_size < sizeof *stats)
        return errorf(NEEDLE_E_INVALID_ARGUMENT, fn, "struct_size " + std::to_string(stats->struct_size) + " < " +
                                                         std::to_string(sizeof *stats));
    const needle::chat::TurnStats &t = chat->chat->last_stats();
    stats->prefill_tokens = t.prefill_tokens, stats->generated_tokens = t.generated_tokens;
    stats->call_tokens = t.call_tokens;
    stats->prefill_ms = t.prefill_ms, stats->decode_ms = t.decode_ms, stats->grammar_ms = t.grammar_ms;
    stats->p_decode = t.p_decode, stats->p_head = t.p_head;
    return NEEDLE_OK;
}

}  // extern "C"
