// libFuzzer target: the tokenizer of a fixed small model (built in memory with the writer: the
// tiny-edge geometry with a 1024-piece vocabulary), through the C API.
//   first byte even: the rest is text. Valid UTF-8 must tokenize (ids < vocab) and detokenize
//     back to the same text (unless it contains U+2581, which decodes to a space); invalid
//     UTF-8 must be NEEDLE_E_INVALID_ARGUMENT.
//   first byte odd: the rest is u16 ids (mod vocab + 8, so a few are out of range).
//     Out-of-range ids must be NEEDLE_E_INVALID_ARGUMENT; otherwise the text is valid UTF-8 and
//     equals what the streaming decoder (needle::TextStream, as needle_generate uses it)
//     delivers piece by piece, each piece whole UTF-8.
#include <memory>
#include <string>
#include <vector>

#include "cact_writer.h"
#include "fuzz_common.h"

namespace {

constexpr uint32_t kVocab = 1024;

struct Fixture {
    needle_model *model = nullptr;
    std::unique_ptr<needle::Tokenizer> tok;  // the same blob, for the streaming decoder
    Fixture() {
        needle::writer::Geometry g = needle::writer::preset("tiny-edge");
        g.vocab_size = kVocab;
        const std::vector<uint8_t> file = needle::writer::write_cact_v2(g, 1);
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.n_threads = 1;
        if (needle_model_load_memory(file.data(), file.size(), &p, &model) != NEEDLE_OK)
            fuzz_fail("fixture model: %s", needle_last_error());
        const std::vector<uint8_t> blob = needle::writer::build_tokenizer_blob(kVocab);
        tok.reset(new needle::Tokenizer(needle::Tokenizer::parse(blob.data(), blob.size(), kVocab)));
    }
};

const Fixture &fixture() {
    static Fixture f;
    return f;
}

std::string detok(const uint32_t *ids, size_t n, needle_status *status) {
    size_t len = 0;
    needle_status st = needle_model_detokenize(fixture().model, ids, n, nullptr, 0, &len);
    if (st != NEEDLE_E_BUFFER_TOO_SMALL) {
        *status = st;
        return "";
    }
    std::string out(len + 1, '\x7f');
    size_t len2 = 0;
    st = needle_model_detokenize(fixture().model, ids, n, &out[0], out.size(), &len2);
    if (st != NEEDLE_OK) fuzz_fail("detokenize after the size query: %s", needle_last_error());
    if (len2 != len || out[len] != '\0') fuzz_fail("detokenize length %zu vs %zu or no NUL", len2, len);
    out.resize(len);
    *status = NEEDLE_OK;
    return out;
}

void text_case(const char *text, size_t n, bool bos) {
    const needle_model *m = fixture().model;
    size_t need = 0;
    needle_status st = needle_model_tokenize(m, text, n, bos, nullptr, 0, &need);
    if (!fuzz_utf8(text, n)) {
        fuzz_expect_refusal(st, {NEEDLE_E_INVALID_ARGUMENT}, "tokenize of invalid UTF-8");
        return;
    }
    if (st != NEEDLE_OK && st != NEEDLE_E_BUFFER_TOO_SMALL) fuzz_fail("tokenize size query: %s", needle_last_error());
    std::vector<uint32_t> ids(need + 1, 0xFFFFFFFFu);
    size_t got = 0;
    st = needle_model_tokenize(m, text, n, bos, ids.data(), need, &got);
    if (st != NEEDLE_OK || got != need) fuzz_fail("tokenize: %s (%zu vs %zu)", needle_last_error(), got, need);
    if (ids[need] != 0xFFFFFFFFu) fuzz_fail("tokenize wrote past the count");
    for (size_t i = 0; i < need; ++i)
        if (ids[i] >= kVocab) fuzz_fail("id %u >= vocab", ids[i]);
    if (bos && (need == 0 || ids[0] != fixture().tok->bos_id())) fuzz_fail("no BOS first");
    const std::string back = detok(ids.data(), need, &st);
    if (st != NEEDLE_OK) fuzz_fail("detokenize of tokenize output: %s", needle_last_error());
    const std::string_view in(text, n);
    if (in.find("\xE2\x96\x81") == std::string_view::npos && back != in)
        fuzz_fail("round trip changed the text (%zu -> %zu bytes)", n, back.size());
}

void ids_case(const uint8_t *data, size_t size) {
    std::vector<uint32_t> ids;
    bool out_of_range = false;
    for (size_t i = 0; i + 1 < size; i += 2) {
        ids.push_back(uint32_t(data[i] | data[i + 1] << 8) % (kVocab + 8));
        out_of_range = out_of_range || ids.back() >= kVocab;
    }
    needle_status st;
    const std::string text = detok(ids.data(), ids.size(), &st);
    if (out_of_range) {
        fuzz_expect_refusal(st, {NEEDLE_E_INVALID_ARGUMENT}, "detokenize of an out-of-range id");
        return;
    }
    if (st != NEEDLE_OK) fuzz_fail("detokenize: %s", needle_last_error());
    if (!fuzz_utf8(text.data(), text.size())) fuzz_fail("detokenize gave invalid UTF-8");
    needle::TextStream stream(*fixture().tok);
    std::string all, piece;
    for (uint32_t id : ids) {
        stream.push(id, piece);
        if (!fuzz_utf8(piece.data(), piece.size())) fuzz_fail("a streamed piece is not whole UTF-8");
        all += piece;
    }
    stream.finish(piece);
    if (!fuzz_utf8(piece.data(), piece.size())) fuzz_fail("the final flush is not whole UTF-8");
    all += piece;
    if (all != text) fuzz_fail("streamed text differs from detokenize");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] % 2 == 0)
        text_case(reinterpret_cast<const char *>(data + 1), size - 1, (data[0] & 2) != 0);
    else
        ids_case(data + 1, size - 1);
    return 0;
}
