// Upstream libneedle's four process-wide calls (tokenizer-and-prompt.md §7; tool-calling.md
// §7.2, §10.1) over one needle_chat. Every call takes one mutex, so calls serialize.
// Negative returns are -(needle_status).
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "capi/handles.h"
#include "needle.h"

namespace {

struct Global {
    std::mutex mu;
    needle_model *model = nullptr;  // needle_load, NEEDLE_MODEL or built in; kept for the process
    needle_chat *chat = nullptr;
};

Global &global() {
    static Global *g = new Global;  // never destroyed: no order-of-destruction hazard at exit
    return *g;
}

int neg(needle_status st) { return st == NEEDLE_OK ? 0 : -int(st); }

int fail(needle_status st, const char *msg) { return neg(needle::capi::set_last_error(st, msg)); }

}  // namespace

extern "C" {

int needle_load(const char *blob, uint64_t size) {
    if (!blob) return fail(NEEDLE_E_INVALID_ARGUMENT, "needle_load: blob is NULL");
    if (size > uint64_t(SIZE_MAX)) return fail(NEEDLE_E_INVALID_ARGUMENT, "needle_load: size does not fit size_t");
    Global &g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    needle_model *m = nullptr;
    const needle_status st = needle::capi::load_memory("needle_load", blob, size_t(size), nullptr, &m);
    if (st != NEEDLE_OK) return neg(st);
    needle_chat_free(g.chat);  // a chat keeps its old model alive until freed
    g.chat = nullptr;
    needle_model_free(g.model);
    g.model = m;
    return 0;
}

int needle_init(const char *system, const char *tools_json, const char *tool_index_path) {
    Global &g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.model) {
        // Upstream's engine has its weights baked in; ours falls back to the built-in demo model.
        const char *path = std::getenv("NEEDLE_MODEL");
        const bool from_file = path && *path;
        const needle_status st = from_file ? needle_model_load_file(path, nullptr, &g.model)
                                           : needle_model_load_builtin(nullptr, &g.model);
        if (st == NEEDLE_E_UNSUPPORTED && !from_file)
            return fail(NEEDLE_E_INVALID_ARGUMENT,
                        "needle_init: no model: call needle_load or set NEEDLE_MODEL (this build has no built-in model)");
        if (st != NEEDLE_OK && from_file)  // say where the path came from: the caller never passed one
            return fail(st, ("needle_init: NEEDLE_MODEL=" + std::string(path) + ": " + needle_last_error()).c_str());
        if (st != NEEDLE_OK) return neg(st);
    }
    needle_chat_params p;
    p.struct_size = sizeof p;
    needle_chat_params_init(&p);
    p.tool_index_path = tool_index_path;  // §9: NULL = embeddings not persisted
    needle_chat *c = nullptr;
    const needle_status st = needle_chat_create(g.model, system, tools_json, &p, &c);
    if (st != NEEDLE_OK) return neg(st);  // the previous conversation stays as it was
    needle_chat_free(g.chat);
    g.chat = c;
    return 0;
}

int needle_complete(const char *text, int max_new_tokens, char *out_buf, int out_buf_size) {
    Global &g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    if (out_buf && out_buf_size >= 1) out_buf[0] = '\0';
    // Argument errors name upstream's parameters and the value passed (a negative size or
    // budget is reported as given, not as the 0 it would become in the chat call).
    if (!text || !out_buf)
        return fail(NEEDLE_E_INVALID_ARGUMENT, !text ? "needle_complete: text is NULL" : "needle_complete: out_buf is NULL");
    if (out_buf_size < 2) {
        const std::string m = "needle_complete: out_buf_size " + std::to_string(out_buf_size) +
                              " (need at least 2 bytes: the envelope and its NUL)";
        return fail(NEEDLE_E_INVALID_ARGUMENT, m.c_str());
    }
    if (max_new_tokens < 1) {
        const std::string m = "needle_complete: max_new_tokens " + std::to_string(max_new_tokens) + " (must be >= 1)";
        return fail(NEEDLE_E_INVALID_ARGUMENT, m.c_str());
    }
    if (!g.chat) return fail(NEEDLE_E_INVALID_ARGUMENT, "needle_complete: call needle_init first");
    return neg(needle_chat_complete(g.chat, text, uint32_t(max_new_tokens), out_buf, size_t(out_buf_size), nullptr));
}

void needle_reset(void) {
    Global &g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    needle_chat_reset(g.chat);
}

}  // extern "C"
