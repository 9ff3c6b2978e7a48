// libFuzzer target: (tools_json, bytes) through the tool-calling JSON and grammar layers
// (tool-calling.md §3.3, §6). Input: tools_json, a NUL byte, then payload bytes.
//   * parse_json either succeeds or throws needle::Error(INVALID_ARGUMENT) with a message;
//   * the canonical form is a fixed point: canonical(parse(canonical(v))) == canonical(v);
//   * Grammar::compile over the named tools succeeds or throws INVALID_ARGUMENT;
//   * the matcher then walks the payload: at every step the mask is non-empty, agrees with
//     accept() for the payload's next byte token and for the lowest allowed id, and a walk that
//     reaches complete() has produced a payload that parse_json accepts (then post_check runs).
#include <memory>
#include <string>
#include <vector>

#include "cact_writer.h"
#include "chat/grammar.h"
#include "chat/json.h"
#include "core/error.h"
#include "fuzz_common.h"

using namespace needle::chat;

namespace {

constexpr uint32_t kVocab = 1024;

const TokenBytes &token_bytes() {
    static const std::vector<uint8_t> blob = needle::writer::build_tokenizer_blob(kVocab);
    static const needle::Tokenizer tok = needle::Tokenizer::parse(blob.data(), blob.size(), kVocab);
    static const TokenBytes tb(tok);
    return tb;
}

bool expect_refusal(const needle::Error &e, const char *what) {
    if (e.code() != NEEDLE_E_INVALID_ARGUMENT) fuzz_fail("%s threw status %d: %s", what, e.code(), e.what());
    if (e.what()[0] == '\0') fuzz_fail("%s threw an empty message", what);
    return false;
}

std::string canonical(const JsonValue &v) {
    std::string s;
    write_canonical(v, s);
    return s;
}

uint32_t byte_token(uint8_t b) { return 14 + b; }  // <0xNN> = 14 + NN in the writer's layout

bool allowed(const std::vector<uint64_t> &mask, uint32_t id) { return (mask[id / 64] >> (id % 64)) & 1; }

void walk(const std::shared_ptr<const Grammar> &g, std::string_view payload) {
    const TokenBytes &tb = token_bytes();
    GrammarMatcher m(g, tb);
    std::vector<uint64_t> mask(tb.words());
    std::string fed;
    for (size_t i = 0; i < payload.size() && i < 512 && !m.complete(); ++i) {
        const size_t n = m.fill_mask(mask.data());
        if (n == 0) fuzz_fail("empty mask after %zu bytes: %.200s", fed.size(), fed.c_str());
        const uint32_t id = byte_token(uint8_t(payload[i]));
        if (allowed(mask, id) != m.accept(id)) fuzz_fail("mask and accept disagree on byte 0x%02x", uint8_t(payload[i]));
        if (allowed(mask, id)) {
            fed += payload[i];
            continue;
        }
        // The payload left the language: finish with the lowest allowed ids for a few steps.
        for (int k = 0; k < 64 && !m.complete(); ++k) {
            if (m.fill_mask(mask.data()) == 0) fuzz_fail("empty mask after %zu bytes", fed.size());
            uint32_t pick = 0;
            while (!allowed(mask, pick)) ++pick;
            if (!m.accept(pick)) fuzz_fail("allowed token %u refused by accept", pick);
            fed += tb.bytes(pick);
        }
        break;
    }
    if (!m.complete()) return;
    if (m.fill_mask(mask.data()) != 1 || !allowed(mask, uint32_t(tb.end_call_id())))
        fuzz_fail("complete() but the mask is not exactly </tool_call>");
    JsonValue calls;
    try {
        calls = parse_json(fed);
    } catch (const needle::Error &e) {
        fuzz_fail("grammar accepted a payload that is not JSON (%s): %.300s", e.what(), fed.c_str());
    }
    if (calls.kind != JsonValue::Kind::Array) fuzz_fail("accepted payload is not an array");
    (void)post_check(*g, calls);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    const size_t nul = in.find('\0');
    const std::string_view tools_json = in.substr(0, nul);
    const std::string_view payload = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    JsonLimits lim;
    lim.max_bytes = 1 << 20;
    JsonValue tools;
    try {
        tools = parse_json(tools_json, lim);
    } catch (const needle::Error &e) {
        return expect_refusal(e, "parse_json"), 0;
    }
    const std::string c1 = canonical(tools);
    try {
        if (canonical(parse_json(c1)) != c1) fuzz_fail("canonical form is not a fixed point: %.200s", c1.c_str());
    } catch (const needle::Error &e) {
        fuzz_fail("canonical form does not parse (%s): %.200s", e.what(), c1.c_str());
    }
    std::vector<const JsonValue *> named;
    if (tools.kind == JsonValue::Kind::Array)
        for (const auto &t : tools.items)
            if (const JsonValue *n = t.find("name"); t.kind == JsonValue::Kind::Object && n && n->kind == JsonValue::Kind::String)
                named.push_back(&t);
    for (int required = 0; required < 2; ++required) {
        GrammarOptions opt;
        opt.require_call = required == 1;
        std::shared_ptr<const Grammar> g;
        try {
            g = Grammar::compile(named, opt);
        } catch (const needle::Error &e) {
            return expect_refusal(e, "Grammar::compile"), 0;
        }
        walk(g, payload);
    }
    return 0;
}
