// libFuzzer target: needle::Tokenizer::parse on arbitrary bytes (container-v2.md §9, §12.6).
// The vocabulary size is the blob's own n_pieces (first u32) so the count check passes and the
// piece walk is reached. parse must either throw needle::Error(NEEDLE_E_FORMAT) with a message
// or give a tokenizer that encodes text, decodes every id to valid UTF-8 and streams the same.
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"

namespace {

void use(const needle::Tokenizer &t) {
    static const std::string texts[] = {"", "a", "Hello world", " two  spaces ",
                                        "<|im_start|>user\nhi<|im_end|>", "\xE6\x97\xA5\xF0\x9F\x98\x80\x01"};
    for (const std::string &s : texts) {
        std::vector<uint32_t> ids;
        t.encode(s, ids);
        for (uint32_t id : ids)
            if (id >= t.size()) fuzz_fail("encode gave id %u >= %u", id, t.size());
        const std::string back = t.decode(ids.data(), ids.size());
        if (!fuzz_utf8(back.data(), back.size())) fuzz_fail("decode gave invalid UTF-8");
    }
    const uint32_t n = t.size() < 4096 ? t.size() : 4096;
    std::vector<uint32_t> all(n);
    for (uint32_t i = 0; i < n; ++i) all[i] = i;
    const std::string text = t.decode(all.data(), n);
    if (!fuzz_utf8(text.data(), text.size())) fuzz_fail("decode of every id gave invalid UTF-8");
    needle::TextStream stream(t);
    std::string streamed, piece;
    for (uint32_t id : all) {
        stream.push(id, piece);
        if (!fuzz_utf8(piece.data(), piece.size())) fuzz_fail("streamed piece is not whole UTF-8");
        streamed += piece;
    }
    stream.finish(piece);
    streamed += piece;
    if (streamed != text) fuzz_fail("streamed text differs from decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint32_t vocab = size >= 4 ? uint32_t(data[0] | data[1] << 8 | data[2] << 16 | uint32_t(data[3]) << 24) : 1;
    needle::Tokenizer t;
    try {
        t = needle::Tokenizer::parse(size ? data : nullptr, size, vocab);
    } catch (const needle::Error &e) {
        if (e.code() != NEEDLE_E_FORMAT) fuzz_fail("parse threw status %d: %s", e.code(), e.what());
        if (e.what()[0] == '\0') fuzz_fail("parse threw an empty message");
        return 0;
    }
    // Any other exception escapes and aborts (libFuzzer reports it): parse must not throw it.
    use(t);
    return 0;
}
