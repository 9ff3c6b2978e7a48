// Streaming text (issue #4): the pieces needle_generate streams come from needle::TextStream.
// Its invariants, on crafted byte-piece sequences (generation output cannot be steered):
//   * every piece is valid UTF-8 (never half a code point), the final flush too;
//   * after each token, the text streamed so far plus what a flush would add equals
//     needle_model_detokenize() of the ids so far (so nothing is held back longer than an
//     incomplete character, and concatenation equals detokenize at the end);
//   * detokenize of byte pieces follows the Unicode "maximal subpart" rule (Python's
//     errors="replace"), checked against an independent reference written here from the
//     definition: each maximal subpart of an ill-formed sequence is one U+FFFD.
// tests/test_tokenizer.cpp covers a few hand-picked cases with the internal decode(); this file
// adds CJK, stray continuation bytes, overlongs, surrogates, > U+10FFFF and an exhaustive sweep,
// through the public needle_model_detokenize, on the fixture tokenizer and the writer's.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api_util.h"
#include "cact_writer.h"
#include "core/bytes.h"
#include "fixtures.h"
#include "needle.h"
#include "tokenizer/tokenizer.h"

using namespace api_test;

namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

// ---------------------------------------------------------------- reference decoder

// Code point of an n-byte sequence (no checks), given its lead and continuation bytes.
uint32_t assemble(const uint8_t *p, size_t n) {
    static const uint8_t lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t c = p[0] & lead_mask[n];
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (p[k] & 0x3F);
    return c;
}

// Length a lead byte announces (1-4), or 0 if it cannot start a sequence by its bit pattern.
size_t announced(uint8_t b) {
    if (b < 0x80) return 1;
    if ((b & 0xE0) == 0xC0) return 2;
    if ((b & 0xF0) == 0xE0) return 3;
    if ((b & 0xF8) == 0xF0) return 4;
    return 0;
}

bool scalar_ok(uint32_t c, size_t n) {
    static const uint32_t min_for[5] = {0, 0, 0x80, 0x800, 0x10000};
    return c >= min_for[n] && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
}

// Is p[0..k) (k < n = announced length) the start of some well-formed n-byte sequence? The
// completions cover the code points [lo, hi] (rest filled with 0x80 .. 0xBF); some completion is
// well formed iff that range, clipped to the legal range for n bytes, is not all surrogates.
bool valid_prefix(const uint8_t *p, size_t k, size_t n) {
    uint8_t lo_b[4], hi_b[4];
    for (size_t i = 0; i < n; ++i) {
        if (i < k) {
            if (i > 0 && (p[i] & 0xC0) != 0x80) return false;
            lo_b[i] = hi_b[i] = p[i];
        } else {
            lo_b[i] = 0x80, hi_b[i] = 0xBF;
        }
    }
    static const uint32_t min_for[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t lo = std::max(assemble(lo_b, n), min_for[n]), hi = std::min<uint32_t>(assemble(hi_b, n), 0x10FFFF);
    if (lo > hi) return false;
    return !(lo >= 0xD800 && hi <= 0xDFFF);
}

// Bytes -> text, each maximal subpart of an ill-formed sequence replaced by one U+FFFD.
std::string reference_decode(const std::string &bytes) {
    const auto *p = reinterpret_cast<const uint8_t *>(bytes.data());
    const size_t n = bytes.size();
    std::string out;
    size_t i = 0;
    while (i < n) {
        const size_t want = announced(p[i]);
        if (want != 0 && i + want <= n) {
            bool conts = true;
            for (size_t k = 1; k < want; ++k) conts = conts && (p[i + k] & 0xC0) == 0x80;
            if (conts && scalar_ok(assemble(p + i, want), want)) {
                out.append(bytes, i, want);
                i += want;
                continue;
            }
        }
        // Longest prefix (>= 1 byte) that could still begin a well-formed sequence.
        size_t sub = 1;
        if (want >= 2)
            for (size_t k = 1; k < want && i + k <= n; ++k)
                if (valid_prefix(p + i, k, want)) sub = k;
        out += kFFFD;
        i += sub;
    }
    return out;
}

// Meta-space -> space, and the leading space of a dummy prefix dropped (tokenizer §3).
std::string finish_text(std::string s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            out += ' ';
            i += 3;
        } else {
            out += s[i++];
        }
    }
    if (!out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

// ---------------------------------------------------------------- tokenizers under test

struct Subject {
    std::string name;
    Model model;
    std::unique_ptr<needle::Tokenizer> tok;  // the same blob, for TextStream
    uint32_t byte_id[256];
};

std::vector<uint8_t> blob_of(const std::vector<uint8_t> &file) {
    const uint32_t n = needle::read_u32(&file[4]);
    const size_t rec = 232 + 44 * size_t(n - 1);
    REQUIRE(file[rec] == 4);
    const uint64_t off = needle::read_u64(&file[rec + 20]), nb = needle::read_u64(&file[rec + 28]);
    return std::vector<uint8_t>(file.begin() + long(off), file.begin() + long(off + nb));
}

std::unique_ptr<Subject> make_subject(const std::string &name, const std::vector<uint8_t> &file) {
    auto s = std::make_unique<Subject>();
    s->name = name;
    needle_model *m = nullptr;
    REQUIRE(needle_model_load_memory(file.data(), file.size(), nullptr, &m) == NEEDLE_OK);
    s->model.reset(m);
    const std::vector<uint8_t> blob = blob_of(file);
    s->tok.reset(new needle::Tokenizer(needle::Tokenizer::parse(blob.data(), blob.size(), info_of(m).vocab_size)));
    REQUIRE(s->tok->add_dummy_prefix());
    for (int v = 0; v < 256; ++v) {
        char surface[8];
        std::snprintf(surface, sizeof surface, "<0x%02X>", v);
        const int64_t id = s->tok->find(surface);
        REQUIRE(id >= 0);
        s->byte_id[v] = uint32_t(id);
    }
    return s;
}

const std::vector<std::unique_ptr<Subject>> &subjects() {
    static std::vector<std::unique_ptr<Subject>> all = [] {
        std::vector<std::unique_ptr<Subject>> v;
        v.push_back(make_subject("tiny (SentencePiece tok1024)", fixtures::read_bytes(model_path("tiny"))));
        needle::writer::Geometry g = needle::writer::preset("tiny-edge");
        g.vocab_size = 1024;
        v.push_back(make_subject("writer 1024", needle::writer::write_cact_v2(g, 1)));
        return v;
    }();
    return all;
}

struct Outcome {
    bool ok = true;
    std::string why;
};

// Streams `ids` and checks every invariant; `expect` (if not null) is the expected final text.
Outcome check_stream(const Subject &s, const std::vector<uint32_t> &ids, const std::string *expect) {
    Outcome o;
    auto fail = [&](const std::string &why) {
        if (o.ok) o.ok = false, o.why = why;
    };
    needle::TextStream ts(*s.tok);
    std::string so_far, piece, flush;
    for (size_t i = 0; i < ids.size(); ++i) {
        ts.push(ids[i], piece);
        if (!needle::utf8_valid(piece)) fail("piece " + std::to_string(i) + " is not whole UTF-8");
        so_far += piece;
        needle::TextStream copy = ts;
        copy.finish(flush);
        if (!needle::utf8_valid(flush)) fail("flush after " + std::to_string(i) + " is not UTF-8");
        const std::vector<uint32_t> head(ids.begin(), ids.begin() + long(i) + 1);
        if (so_far + flush != detokenize(s.model.get(), head))
            fail("streamed + flush != detokenize after token " + std::to_string(i));
        if (flush.size() > kFFFD.size()) fail("more than one incomplete character held back");
    }
    ts.finish(flush);
    so_far += flush;
    const std::string whole = detokenize(s.model.get(), ids);
    if (!needle::utf8_valid(whole)) fail("detokenize is not valid UTF-8");
    if (so_far != whole) fail("streamed text != detokenize");
    if (expect && whole != *expect) fail("detokenize != expected");
    return o;
}

std::string hex(const std::vector<uint8_t> &b) {
    std::string s;
    char x[4];
    for (uint8_t v : b) std::snprintf(x, sizeof x, "%02X ", v), s += x;
    return s;
}

}  // namespace

TEST_CASE("stream: the reference decoder of this file") {
    CHECK(reference_decode("a\xC3\xA9") == "a\xC3\xA9");
    CHECK(reference_decode("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
    CHECK(reference_decode("\xC0\xAF") == kFFFD + kFFFD);              // overlong: C0 never starts
    CHECK(reference_decode("\xE0\x80\xAF") == kFFFD + kFFFD + kFFFD);  // E0 80 is not a prefix
    CHECK(reference_decode("\xED\xA0\x80") == kFFFD + kFFFD + kFFFD);  // surrogate D800
    CHECK(reference_decode("\xF4\x90\x80\x80") == kFFFD + kFFFD + kFFFD + kFFFD);
    CHECK(reference_decode("\xE2\x96") == kFFFD);                      // truncated: one subpart
    CHECK(reference_decode("\xF0\x9F\x98" "a") == kFFFD + "a");
    CHECK(reference_decode("\x80\xBF") == kFFFD + kFFFD);
    CHECK(reference_decode("\xED\x9F\xBF") == "\xED\x9F\xBF");  // U+D7FF is fine
}

TEST_CASE("stream: crafted byte-piece sequences never stream half a character") {
    struct Case {
        const char *what;
        std::vector<uint8_t> bytes;
        std::string expect;
    };
    const std::vector<Case> cases = {
        {"emoji as 4 byte pieces", {0xF0, 0x9F, 0x98, 0x80}, "\xF0\x9F\x98\x80"},
        {"two emoji back to back", {0xF0, 0x9F, 0x91, 0x8D, 0xF0, 0x9F, 0x8F, 0xBD}, "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"},
        {"CJK as 3 byte pieces each", {0xE6, 0x97, 0xA5, 0xE6, 0x9C, 0xAC, 0xE8, 0xAA, 0x9E}, "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"},
        {"2-byte letter", {0x63, 0x61, 0x66, 0xC3, 0xA9}, "caf\xC3\xA9"},
        {"U+10FFFF", {0xF4, 0x8F, 0xBF, 0xBF}, "\xF4\x8F\xBF\xBF"},
        {"truncated emoji at the end", {0xF0, 0x9F, 0x98}, kFFFD},
        {"truncated CJK then ASCII", {0xE6, 0x97, 0x41}, kFFFD + "A"},
        {"stray continuation bytes", {0x80, 0x41, 0xBF, 0xBF}, kFFFD + "A" + kFFFD + kFFFD},
        {"continuation after a complete character", {0xC3, 0xA9, 0xA9}, "\xC3\xA9" + kFFFD},
        {"overlong slash C0 AF", {0xC0, 0xAF}, kFFFD + kFFFD},
        {"overlong slash E0 80 AF", {0xE0, 0x80, 0xAF}, kFFFD + kFFFD + kFFFD},
        {"overlong F0 80 80 AF", {0xF0, 0x80, 0x80, 0xAF}, kFFFD + kFFFD + kFFFD + kFFFD},
        {"surrogate ED A0 80", {0xED, 0xA0, 0x80}, kFFFD + kFFFD + kFFFD},
        {"surrogate pair as CESU-8", {0xED, 0xA0, 0xBD, 0xED, 0xB8, 0x80}, kFFFD + kFFFD + kFFFD + kFFFD + kFFFD + kFFFD},
        {"above U+10FFFF", {0xF4, 0x90, 0x80, 0x80}, kFFFD + kFFFD + kFFFD + kFFFD},
        {"F5..FF never start", {0xF5, 0xFE, 0xFF, 0x41}, kFFFD + kFFFD + kFFFD + "A"},
        {"lead then another lead", {0xE2, 0xF0, 0x9F, 0x98, 0x80}, kFFFD + "\xF0\x9F\x98\x80"},
        {"meta-space from bytes at the start", {0xE2, 0x96, 0x81, 0x41}, "A"},
        {"NUL and DEL", {0x00, 0x7F}, std::string("\0\x7F", 2)},
    };
    for (const auto &sp : subjects()) {
        const Subject &s = *sp;
        CAPTURE(s.name);
        for (const Case &c : cases) {
            CAPTURE(c.what);
            std::vector<uint32_t> ids;
            for (uint8_t b : c.bytes) ids.push_back(s.byte_id[b]);
            const std::string raw(c.bytes.begin(), c.bytes.end());
            CHECK(finish_text(reference_decode(raw)) == c.expect);  // the table above is right
            Outcome o = check_stream(s, ids, &c.expect);
            INFO(o.why);
            CHECK(o.ok);
            // The same bytes behind BOS and a normal piece ("\u2581t"), followed by EOS.
            const int64_t word = s.tok->find("\xE2\x96\x81t");
            REQUIRE(word >= 0);
            std::vector<uint32_t> wrapped{s.tok->bos_id(), uint32_t(word)};
            wrapped.insert(wrapped.end(), ids.begin(), ids.end());
            wrapped.push_back(s.tok->eos_id());
            const std::string expect2 = finish_text("\xE2\x96\x81t" + reference_decode(raw));
            Outcome o2 = check_stream(s, wrapped, &expect2);
            INFO(o2.why);
            CHECK(o2.ok);
        }
    }
}

TEST_CASE("stream: every sequence of up to 3 interesting bytes, and random mixes") {
    // Bytes at every class boundary of the UTF-8 table.
    const std::vector<uint8_t> interesting = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                                              0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
    const Subject &s = *subjects()[0];
    size_t sequences = 0, failures = 0;
    std::string first_failure;
    auto run = [&](const std::vector<uint8_t> &bytes) {
        std::vector<uint32_t> ids;
        for (uint8_t b : bytes) ids.push_back(s.byte_id[b]);
        const std::string want = finish_text(reference_decode(std::string(bytes.begin(), bytes.end())));
        const Outcome o = check_stream(s, ids, &want);
        ++sequences;
        if (!o.ok && failures++ == 0) first_failure = hex(bytes) + ": " + o.why;
    };
    const size_t k = interesting.size();
    for (size_t a = 0; a < k; ++a) {
        run({interesting[a]});
        for (size_t b = 0; b < k; ++b) {
            run({interesting[a], interesting[b]});
            for (size_t c = 0; c < k; ++c) run({interesting[a], interesting[b], interesting[c]});
        }
    }
    // Random 4..9-byte sequences biased to multi-byte leads and continuations, plus valid 4-byte
    // characters cut at random points.
    std::mt19937 rng(2024);
    for (int it = 0; it < 3000; ++it) {
        std::vector<uint8_t> bytes(4 + rng() % 6);
        for (uint8_t &b : bytes) b = rng() % 3 ? uint8_t(0x80 + rng() % 0x80) : interesting[rng() % k];
        run(bytes);
    }
    INFO("first failure: " << first_failure);
    CHECK(failures == 0);
    MESSAGE("stream: " << sequences << " byte sequences streamed; pieces whole UTF-8, streamed == detokenize == "
                       << "maximal-subpart reference");
}
