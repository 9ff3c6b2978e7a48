// libFuzzer target: (tools_json, query) through the whole chat layer of the C API
// (tool-calling.md §3, §6, §7): needle_chat_create, _render and a few constrained decode steps
// of _complete, on a small model built in memory (the tiny-edge shapes with a 1024-piece
// vocabulary, the chat markers, both probe heads and room for a 256-position turn).
// Input: tools_json, a NUL byte, then the query (no NUL: the query is all of the input).
// Invariants:
//   * create succeeds, or fails with INVALID_ARGUMENT / CONTEXT_FULL and a message;
//   * render of valid UTF-8 succeeds, ends with the query's turn and is valid UTF-8; invalid
//     UTF-8 is INVALID_ARGUMENT;
//   * complete (max_new_tokens 4, then 48 after a reset so that short call lists close;
//     tool_choice auto and required, validation off and on) returns
//     NEEDLE_OK and an envelope that is strict JSON (nlohmann: no NaN) with the documented keys
//     in order (plus "validation" last when on), known error codes, success iff no error_code,
//     calls that are {"name", "arguments"} of a declared tool, confidence in [0, 1], finite
//     non-negative figures;
//   * a buffer of 8 bytes gives BUFFER_TOO_SMALL and "" (the minimal envelope does not fit);
//   * the same after reset.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cact_writer.h"
#include "fuzz_common.h"

namespace {

constexpr uint32_t kVocab = 1024;

needle_model *model() {
    static needle_model *m = [] {
        needle::writer::Geometry g = needle::writer::preset("tiny-edge");
        g.vocab_size = kVocab;
        g.max_seq_len = 640;  // the static prefix may take up to 384 positions
        g.kv_window = 64;
        g.with_heads = true;
        const std::vector<uint8_t> file = needle::writer::write_cact_v2(g, 7);
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.n_threads = 1;
        needle_model *out = nullptr;
        if (needle_model_load_memory(file.data(), file.size(), &p, &out) != NEEDLE_OK)
            fuzz_fail("fixture model: %s", needle_last_error());
        return out;
    }();
    return m;
}

struct ChatDel {
    void operator()(needle_chat *c) const { needle_chat_free(c); }
};
using Chat = std::unique_ptr<needle_chat, ChatDel>;

const char *const kKeys[] = {"type",      "success",    "error",       "error_code", "reason",
                             "function_calls", "suppressed_calls", "reasoning", "confidence",
                             "prefill_tps", "decode_tps", "peak_ram_mb"};
const char *const kCodes[] = {"truncated", "context_full", "invalid_input", "schema_violation", "no_call", "internal"};

void check_render(needle_chat *c, const std::string &query) {
    size_t len = 0;
    needle_status st = needle_chat_render(c, query.c_str(), nullptr, 0, &len);
    if (!fuzz_utf8(query.data(), query.size())) {
        fuzz_expect_refusal(st, {NEEDLE_E_INVALID_ARGUMENT}, "render of invalid UTF-8");
        return;
    }
    if (st != NEEDLE_E_BUFFER_TOO_SMALL) fuzz_fail("render size query: %d %s", st, needle_last_error());
    std::string out(len + 1, '\x7f');
    size_t len2 = 0;
    st = needle_chat_render(c, query.c_str(), &out[0], out.size(), &len2);
    if (st != NEEDLE_OK || len2 != len || out[len] != '\0') fuzz_fail("render: %d %s", st, needle_last_error());
    out.resize(len);
    const std::string tail = query + "<|im_end|>\n<|im_start|>assistant\n";
    if (out.size() < tail.size() || out.compare(out.size() - tail.size(), tail.size(), tail) != 0)
        fuzz_fail("render does not end with the query's turn");
    if (!fuzz_utf8(out.data(), out.size())) fuzz_fail("render is not valid UTF-8");
}

bool is_null_or_string(const nlohmann::ordered_json &v) { return v.is_null() || v.is_string(); }

// names: the declared tool names, or nullptr when they could not be read independently.
void check_envelope(const std::string &text, const std::vector<std::string> *names, bool validation) {
    nlohmann::ordered_json env;
    try {
        env = nlohmann::ordered_json::parse(text);
    } catch (const std::exception &e) {
        fuzz_fail("envelope is not JSON (%s): %.300s", e.what(), text.c_str());
    }
    if (!env.is_object()) fuzz_fail("envelope is not an object");
    size_t k = 0;
    for (auto it = env.begin(); it != env.end(); ++it, ++k) {
        const bool extra = k == 12 && validation && it.key() == "validation";
        if (!(k < 12 && it.key() == kKeys[k]) && !extra) fuzz_fail("envelope key %zu is %s: %.300s", k, it.key().c_str(), text.c_str());
    }
    if (k < 12) fuzz_fail("envelope has %zu keys", k);
    const auto &type = env["type"];
    if (type != "call" && type != "respond") fuzz_fail("type %s", type.dump().c_str());
    if (!env["success"].is_boolean() || !is_null_or_string(env["error"]) || !is_null_or_string(env["error_code"]) ||
        !is_null_or_string(env["reason"]) || !env["reasoning"].is_string())
        fuzz_fail("field types: %.300s", text.c_str());
    const bool ok = env["success"].get<bool>();
    if (ok != env["error_code"].is_null() || ok != env["error"].is_null()) fuzz_fail("success vs error: %.300s", text.c_str());
    if (!ok) {
        bool known = false;
        for (const char *c : kCodes) known = known || env["error_code"] == c;
        if (!known) fuzz_fail("unknown error_code %s", env["error_code"].dump().c_str());
        if (env["error_code"] == "internal") fuzz_fail("internal error: %.300s", text.c_str());
    }
    for (const char *list : {"function_calls", "suppressed_calls"}) {
        if (!env[list].is_array()) fuzz_fail("%s is not an array", list);
        for (const auto &c : env[list]) {
            if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("arguments") ||
                !c["arguments"].is_object())
                fuzz_fail("%s element: %.300s", list, c.dump().c_str());
            bool declared = !names;
            for (size_t i = 0; names && i < names->size(); ++i) declared = declared || c["name"] == (*names)[i];
            if (!declared) fuzz_fail("call of an undeclared tool: %.300s", c.dump().c_str());
        }
    }
    if (!ok && !env["function_calls"].empty()) fuzz_fail("failed turn with calls");
    const double conf = env["confidence"].is_number() ? env["confidence"].get<double>() : -1.0;
    if (!(conf >= 0.0 && conf <= 1.0)) fuzz_fail("confidence %s", env["confidence"].dump().c_str());
    for (const char *f : {"prefill_tps", "decode_tps", "peak_ram_mb"})
        if (!env[f].is_number() || !std::isfinite(env[f].get<double>()) || env[f].get<double>() < 0)
            fuzz_fail("%s %s", f, env[f].dump().c_str());
    if (env.contains("validation")) {
        const auto &v = env["validation"];
        if (!v.is_object() || !v["ungrounded"].is_array() || !v["negation"].is_boolean() || v.size() != 2)
            fuzz_fail("validation field: %s", v.dump().c_str());
    }
}

void turn(needle_chat *c, const std::string &query, uint32_t max_new_tokens, const std::vector<std::string> *names,
          bool validation) {
    std::vector<char> buf(65536, 'x');
    size_t len = 0;
    const needle_status st = needle_chat_complete(c, query.c_str(), max_new_tokens, buf.data(), buf.size(), &len);
    if (st != NEEDLE_OK) fuzz_fail("complete returned %d: %s", st, needle_last_error());
    if (buf[len] != '\0' || std::strlen(buf.data()) != len) fuzz_fail("envelope length or NUL");
    check_envelope(std::string(buf.data(), len), names, validation);
}

// The names the grammar may emit (every string "name" of an object element; the chat already
// refused a list where one is missing). False when nlohmann cannot read the list (Python
// accepts NaN and lone surrogates, which nlohmann refuses): names are then not checked.
bool declared_names(const std::string &tools, std::vector<std::string> &out) {
    try {
        const auto j = nlohmann::json::parse(tools);
        for (const auto &t : j)
            if (t.is_object() && t.contains("name") && t["name"].is_string()) out.push_back(t["name"]);
        return true;
    } catch (const std::exception &) {
        return false;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (size_t(1) << 16)) return 0;
    const std::string in(reinterpret_cast<const char *>(data), size);
    const size_t nul = in.find('\0');
    if (nul == std::string::npos) return 0;
    const std::string tools = in.substr(0, nul), query = in.substr(nul + 1);
    if (query.find('\0') != std::string::npos) return 0;
    std::vector<std::string> names;
    const bool names_known = declared_names(tools, names);
    for (int32_t choice : {NEEDLE_TOOL_CHOICE_AUTO, NEEDLE_TOOL_CHOICE_REQUIRED}) {
        needle_chat_params p;
        p.struct_size = sizeof p;
        needle_chat_params_init(&p);
        p.tool_choice = choice;
        p.validation = choice == NEEDLE_TOOL_CHOICE_REQUIRED ? NEEDLE_VALIDATION_SUPPRESS : NEEDLE_VALIDATION_OFF;
        const bool validation = p.validation != NEEDLE_VALIDATION_OFF;
        needle_chat *raw = nullptr;
        const needle_status st = needle_chat_create(model(), "", tools.c_str(), &p, &raw);
        if (st != NEEDLE_OK) {
            fuzz_expect_refusal(st, {NEEDLE_E_INVALID_ARGUMENT, NEEDLE_E_CONTEXT_FULL}, "needle_chat_create");
            if (raw) fuzz_fail("create failed but returned a chat");
            continue;
        }
        Chat c(raw);
        check_render(c.get(), query);
        turn(c.get(), query, 4, names_known ? &names : nullptr, validation);
        char small[8];
        size_t len = 0;
        const needle_status s2 = needle_chat_complete(c.get(), query.c_str(), 1, small, sizeof small, &len);
        if (s2 != NEEDLE_E_BUFFER_TOO_SMALL || small[0] != '\0' || len < 100)
            fuzz_fail("8-byte buffer: status %d, first byte %d, len %zu", s2, small[0], len);
        // After reset, a budget that lets a short call list close (calls, validation, suppression).
        needle_chat_reset(c.get());
        turn(c.get(), query, 48, names_known ? &names : nullptr, validation);
    }
    return 0;
}
