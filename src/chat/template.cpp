#include "chat/template.h"

#include "core/error.h"

namespace needle {
namespace chat {

std::string render_static_prefix(std::string_view system, std::string_view tools) {
    std::string s;
    s.reserve(system.size() + tools.size() + 64);
    if (!system.empty()) {  // omitted only for "" (a string of spaces is rendered as is)
        s += "<|im_start|>system\n";
        s += system;
        s += "<|im_end|>\n";
    }
    s += "<|im_start|>user\n<tools>";
    s += tools;
    s += "</tools>";
    return s;
}

std::string render_first_turn_suffix(std::string_view query) {
    std::string s;
    s.reserve(query.size() + 40);
    s += "\n";
    s += query;
    s += "<|im_end|>\n<|im_start|>assistant\n";
    return s;
}

std::string render_later_turn(TurnKind kind, std::string_view text) {
    std::string s;
    s.reserve(text.size() + 80);
    s += "<|im_end|>\n<|im_start|>user\n";
    if (kind == TurnKind::ToolResults) {
        s += "<tool_result>";
        s += text;  // verbatim: the binding's json.dumps(results), not re-serialised
        s += "</tool_result>";
    } else {
        s += text;
    }
    s += "<|im_end|>\n<|im_start|>assistant\n";
    return s;
}

namespace {
uint32_t marker(const Tokenizer &tok, const char *surface) {
    const int64_t id = tok.find(surface);
    if (id < 0 || tok.type(uint32_t(id)) != PieceType::UserDefined)
        fail(NEEDLE_E_UNSUPPORTED, strf("chat: the tokenizer has no %s marker", surface));
    return uint32_t(id);
}
}  // namespace

MarkerIds marker_ids(const Tokenizer &tok) {
    MarkerIds m;
    m.bos = tok.bos_id();
    m.eos = tok.eos_id();
    m.im_start = marker(tok, "<|im_start|>");
    m.im_end = marker(tok, "<|im_end|>");
    m.think = marker(tok, "<think>");
    m.think_end = marker(tok, "</think>");
    m.tools = marker(tok, "<tools>");
    m.tools_end = marker(tok, "</tools>");
    m.tool_call = marker(tok, "<tool_call>");
    m.tool_call_end = marker(tok, "</tool_call>");
    std::vector<uint32_t> ids;
    tok.encode("<|im_end|>", ids);  // [dummy prefix ids..., im_end]
    if (ids.empty() || ids.back() != m.im_end)
        fail(NEEDLE_E_UNSUPPORTED, "chat: the tokenizer does not keep <|im_end|> as one marker");
    ids.pop_back();
    m.dummy_prefix = std::move(ids);
    return m;
}

void encode_continuation(const Tokenizer &tok, const MarkerIds &m, std::string_view text,
                         std::vector<uint32_t> &out) {
    const size_t start = out.size();
    tok.encode(text, out);
    const size_t k = m.dummy_prefix.size();
    bool ok = out.size() > start + k;
    for (size_t i = 0; ok && i < k; ++i) ok = out[start + i] == m.dummy_prefix[i];
    if (!ok) fail(NEEDLE_E_INTERNAL, "chat: a continuation did not encode as dummy prefix + marker");
    out.erase(out.begin() + std::ptrdiff_t(start), out.begin() + std::ptrdiff_t(start + k));
}

}  // namespace chat
}  // namespace needle
