// Tokenizer tests: fixture agreement (fixtures/v2/tokenizer_refs.json, refs/*/manifest.json),
// streaming detokenizer invariants, blob validation (container-v2.md §12.6 rules 25-29) and a
// differential check of the heap-based BPE against the rescanning definition
// (tokenizer-and-prompt.md §2.5).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"
#include "fixtures.h"
#include "tokenizer/tokenizer.h"

using needle::PieceType;
using needle::TextStream;
using needle::Tokenizer;
using json = nlohmann::json;

// Readable failure output for id lists.
namespace doctest {
template <> struct StringMaker<std::vector<uint32_t>> {
    static String convert(const std::vector<uint32_t> &v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
        return (s + "]").c_str();
    }
};
}  // namespace doctest

namespace {

const std::string kFixtures = fixtures::v2("");  // honours $NEEDLE_FIXTURES
const char *const kMeta = "\xE2\x96\x81";  // U+2581
const char *const kFFFD = "\xEF\xBF\xBD";  // U+FFFD

using fixtures::read_bytes;
using fixtures::read_json;

// Test-local extraction of the RAW tokenizer blob (the last directory record, container-v2.md
// §1/§4), so these tests do not depend on the container loader.
struct BlobRef {
    std::vector<uint8_t> file;
    const uint8_t *data;
    size_t size;
    uint32_t vocab;
};

BlobRef tokenizer_blob(const std::string &model) {
    BlobRef b;
    b.file = read_bytes(kFixtures + "models/" + model + ".cact");
    REQUIRE(b.file.size() >= 120);
    const uint32_t num_tensors = needle::read_u32(&b.file[4]);
    const uint32_t codebook_len = needle::read_u32(&b.file[8]);
    b.vocab = needle::read_u32(&b.file[20]);
    const size_t rec = 120 + 4 * size_t(codebook_len) + 44 * (size_t(num_tensors) - 1);
    REQUIRE(rec + 44 <= b.file.size());
    REQUIRE(b.file[rec] == 4);  // RAW
    const uint64_t off = needle::read_u64(&b.file[rec + 20]);
    const uint64_t n = needle::read_u64(&b.file[rec + 28]);
    REQUIRE(off + n <= b.file.size());
    b.data = b.file.data() + off;
    b.size = size_t(n);
    return b;
}

// One parsed tokenizer per model, shared by all tests.
const Tokenizer &model_tokenizer(const std::string &model) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto &slot = cache[model];
    if (!slot) {
        BlobRef b = tokenizer_blob(model);
        slot.reset(new Tokenizer(Tokenizer::parse(b.data, b.size, b.vocab)));
    }
    return *slot;
}

const Tokenizer &named_tokenizer(const std::string &tok) {
    return model_tokenizer(tok == "tok8192" ? "needle2" : "tiny");
}

std::vector<uint32_t> encode(const Tokenizer &t, const std::string &text) {
    std::vector<uint32_t> ids;
    t.encode(text, ids);
    return ids;
}

std::string decode(const Tokenizer &t, const std::vector<uint32_t> &ids) {
    return t.decode(ids.data(), ids.size());
}

// Streams `ids` through a TextStream, checking each piece is whole UTF-8.
std::string stream_all(const Tokenizer &t, const std::vector<uint32_t> &ids,
                       std::vector<std::string> *pieces = nullptr) {
    TextStream ts(t);
    std::string all, piece;
    for (uint32_t id : ids) {
        ts.push(id, piece);
        CHECK(needle::utf8_valid(piece));
        all += piece;
        if (pieces) pieces->push_back(piece);
    }
    ts.finish(piece);
    CHECK(needle::utf8_valid(piece));
    all += piece;
    if (pieces) pieces->push_back(piece);
    return all;
}

// --- rescanning reference (tokenizer-and-prompt.md §2, written the slow, obvious way) --------

std::vector<std::string> code_points(const std::string &s) {
    std::vector<std::string> cps;
    for (size_t i = 0; i < s.size();) {
        unsigned char b = s[i];
        size_t l = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        cps.push_back(s.substr(i, l));
        i += l;
    }
    return cps;
}

void reference_bpe(const Tokenizer &t, const std::vector<std::string> &segment,
                   std::vector<uint32_t> &out) {
    std::vector<std::string> sym = segment;
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (size_t j = 0; j + 1 < sym.size(); ++j) {
            int64_t id = t.find(sym[j] + sym[j + 1]);
            if (id < 0) continue;
            float s = t.score(uint32_t(id));
            if (best < 0 || s > best_score) best = int(j), best_score = s;
        }
        if (best < 0) break;
        sym[best] += sym[best + 1];
        sym.erase(sym.begin() + best + 1);
    }
    for (const std::string &s : sym) {
        int64_t id = t.find(s);
        if (id >= 0) {
            out.push_back(uint32_t(id));
        } else if (t.byte_fallback()) {
            for (unsigned char b : s) {
                char name[8];
                std::snprintf(name, sizeof name, "<0x%02X>", b);
                int64_t bid = t.find(name);
                out.push_back(bid >= 0 ? uint32_t(bid) : t.unk_id());
            }
        } else {
            out.push_back(t.unk_id());
        }
    }
}

std::vector<uint32_t> reference_encode(const Tokenizer &t, const std::string &text) {
    std::vector<uint32_t> out;
    if (text.empty()) return out;
    std::string esc = t.add_dummy_prefix() ? kMeta : "";
    for (char c : text) esc += c == ' ' ? std::string(kMeta) : std::string(1, c);
    std::vector<uint32_t> markers;
    for (uint32_t id = 0; id < t.size(); ++id)
        if (t.type(id) == PieceType::UserDefined) markers.push_back(id);
    std::stable_sort(markers.begin(), markers.end(), [&](uint32_t a, uint32_t b) {
        return code_points(std::string(t.surface(a))).size() >
               code_points(std::string(t.surface(b))).size();
    });
    std::vector<std::string> pending;
    size_t pos = 0;
    while (pos < esc.size()) {
        bool matched = false;
        for (uint32_t m : markers) {
            std::string_view s = t.surface(m);
            if (esc.compare(pos, s.size(), s) == 0) {
                reference_bpe(t, pending, out);
                pending.clear();
                out.push_back(m);
                pos += s.size();
                matched = true;
                break;
            }
        }
        if (matched) continue;
        std::string cp = code_points(esc.substr(pos, 4))[0];
        pending.push_back(cp);
        pos += cp.size();
    }
    reference_bpe(t, pending, out);
    return out;
}

// --- synthetic blobs (container-v2.md §9) ----------------------------------------------------

struct SynPiece {
    float score;
    uint8_t type;
    std::string surface;
};

struct SynBlob {
    uint32_t pad = 0, eos = 1, bos = 2, unk = 3;
    uint8_t add_dummy_prefix = 1, byte_fallback = 1;
    std::vector<SynPiece> pieces;

    std::vector<uint8_t> bytes(uint32_t n_pieces_field) const {
        std::vector<uint8_t> b;
        auto u32 = [&](uint32_t v) {
            for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
        };
        u32(n_pieces_field), u32(pad), u32(eos), u32(bos), u32(unk);
        b.push_back(add_dummy_prefix), b.push_back(byte_fallback), b.push_back(0), b.push_back(0);
        for (const SynPiece &p : pieces) {
            uint32_t bits;
            std::memcpy(&bits, &p.score, 4);
            u32(bits);
            b.push_back(p.type);
            b.push_back(uint8_t(p.surface.size())), b.push_back(uint8_t(p.surface.size() >> 8));
            b.insert(b.end(), p.surface.begin(), p.surface.end());
        }
        return b;
    }
    std::vector<uint8_t> bytes() const { return bytes(uint32_t(pieces.size())); }
    Tokenizer parse() const {
        auto b = bytes();
        return Tokenizer::parse(b.data(), b.size(), uint32_t(pieces.size()));
    }
    uint32_t add(float score, std::string surface, uint8_t type = 0) {
        pieces.push_back({score, type, std::move(surface)});
        return uint32_t(pieces.size() - 1);
    }
};

// Specials, the ten markers (ids 4..13) and 256 byte pieces (14..269), as in needle2 (§1).
SynBlob base_blob() {
    SynBlob s;
    s.add(0, "<pad>", 2), s.add(0, "</s>", 2), s.add(0, "<s>", 2), s.add(0, "<unk>", 1);
    for (const char *m : {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>",
                          "</tools>", "<tool_call>", "</tool_call>", "<tool_result>",
                          "</tool_result>"})
        s.add(0, m, 3);
    for (int v = 0; v < 256; ++v) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", v);
        s.add(0, name, 4);
    }
    return s;
}

// Parses and returns the FORMAT error message ("" if it parsed, "<code N>" for another code).
std::string format_error(const std::vector<uint8_t> &b, uint32_t vocab) {
    try {
        Tokenizer::parse(b.data(), b.size(), vocab);
    } catch (const needle::Error &e) {
        if (e.code() != NEEDLE_E_FORMAT) return "<code " + std::to_string(e.code()) + ">";
        return e.what();
    }
    return "";
}

bool contains(const std::string &hay, const std::string &needle) {
    return hay.find(needle) != std::string::npos;
}

#define CHECK_FORMAT_ERROR(bytes, vocab, fragment)                                           \
    do {                                                                                     \
        std::string msg_ = format_error(bytes, vocab);                                       \
        INFO("message: " << msg_);                                                           \
        CHECK(contains(msg_, "tokenizer: "));                                                \
        CHECK(contains(msg_, fragment));                                                     \
    } while (0)

std::vector<uint32_t> ids_of(const json &j) { return j.get<std::vector<uint32_t>>(); }

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("tokenizer: fixture blobs parse with needle2's layout") {
    for (const char *model : {"tiny", "odd", "ternary", "needle2"}) {
        CAPTURE(model);
        const Tokenizer &t = model_tokenizer(model);
        CHECK(t.size() == (std::string(model) == "needle2" ? 8192u : 1024u));
        CHECK(t.pad_id() == 0);
        CHECK(t.eos_id() == 1);
        CHECK(t.bos_id() == 2);
        CHECK(t.unk_id() == 3);
        CHECK(t.add_dummy_prefix());
        CHECK(t.byte_fallback());
        CHECK(t.find("<|im_start|>") == 4);
        CHECK(t.find("</tool_result>") == 13);
        CHECK(t.find("<0x0A>") == 24);
        CHECK(t.type(24) == PieceType::Byte);
        CHECK(t.token_bytes(24) == "\n");
        CHECK(t.token_bytes(1).empty());  // CONTROL
        CHECK(t.token_bytes(3).empty());  // UNKNOWN
        CHECK(t.token_bytes(5) == "<|im_end|>");
        CHECK(t.find("no such piece") == -1);
    }
}

TEST_CASE("tokenizer: encode/decode agree with tokenizer_refs.json") {
    json refs = read_json(kFixtures + "tokenizer_refs.json");
    for (const char *tok : {"tok1024", "tok8192"}) {
        const Tokenizer &t = named_tokenizer(tok);
        const json &list = refs["refs"][tok];
        REQUIRE(list.size() == 222);
        for (const json &e : list) {
            const std::string text = e["text"];
            CAPTURE(tok);
            CAPTURE(text);
            const std::vector<uint32_t> want = ids_of(e["ids"]);
            // The fixtures record RefTokenizer's answer separately when it differs (§4).
            const std::vector<uint32_t> ref_want =
                e["ref_tokenizer_ids"].is_null() ? want : ids_of(e["ref_tokenizer_ids"]);
            CHECK(encode(t, text) == ref_want);
            const std::string dec_want = e["ref_tokenizer_decoded"].is_null()
                                             ? e["decoded"].get<std::string>()
                                             : e["ref_tokenizer_decoded"].get<std::string>();
            CHECK(decode(t, want) == dec_want);
        }
    }
}

TEST_CASE("tokenizer: every fixture prompt encodes to its manifest ids") {
    for (const char *model : {"tiny", "odd", "ternary", "needle2"}) {
        const Tokenizer &t = model_tokenizer(model);
        json man = read_json(kFixtures + "refs/" + model + "/manifest.json");
        REQUIRE(!man["prompts"].empty());
        for (const json &p : man["prompts"]) {
            CAPTURE(model);
            CAPTURE(p["name"].get<std::string>());
            std::vector<uint32_t> ids{t.bos_id()};
            t.encode(p["text"].get<std::string>(), ids);
            CHECK(ids == ids_of(p["ids"]));
        }
    }
}

TEST_CASE("tokenizer: streaming decode concatenates to decode() on every fixture") {
    json refs = read_json(kFixtures + "tokenizer_refs.json");
    for (const char *tok : {"tok1024", "tok8192"}) {
        const Tokenizer &t = named_tokenizer(tok);
        for (const json &e : refs["refs"][tok]) {
            CAPTURE(e["text"].get<std::string>());
            std::vector<uint32_t> ids = ids_of(e["ids"]);
            CHECK(stream_all(t, ids) == decode(t, ids));
            // Also behind a control token (BOS) and with EOS after: both contribute nothing.
            ids.insert(ids.begin(), t.bos_id());
            ids.push_back(t.eos_id());
            CHECK(stream_all(t, ids) == decode(t, ids));
        }
    }
    for (const char *model : {"tiny", "needle2"}) {
        const Tokenizer &t = model_tokenizer(model);
        json man = read_json(kFixtures + "refs/" + model + "/manifest.json");
        for (const json &p : man["prompts"]) {
            std::vector<uint32_t> ids = ids_of(p["ids"]);
            CHECK(stream_all(t, ids) == decode(t, ids));
            for (uint32_t id : p["decode"]["argmax"]) ids.push_back(id);  // generated tokens
            CHECK(stream_all(t, ids) == decode(t, ids));
        }
    }
}

TEST_CASE("tokenizer: streaming decode of split, truncated and stray bytes") {
    const Tokenizer &t = named_tokenizer("tok1024");
    auto byte = [&](int v) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", v);
        return uint32_t(t.find(name));
    };
    const uint32_t meta = uint32_t(t.find(kMeta));

    SUBCASE("emoji split over four byte pieces comes out whole at the last one") {
        std::vector<std::string> pieces;
        std::vector<uint32_t> ids{byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)};
        CHECK(stream_all(t, ids, &pieces) == "\xF0\x9F\x98\x80");
        CHECK(pieces == std::vector<std::string>{"", "", "", "\xF0\x9F\x98\x80", ""});
        CHECK(decode(t, ids) == "\xF0\x9F\x98\x80");
    }
    SUBCASE("a truncated sequence at the end becomes one U+FFFD at finish()") {
        std::vector<std::string> pieces;
        std::vector<uint32_t> ids{uint32_t(t.find("a")), byte(0xE2), byte(0x96)};
        CHECK(stream_all(t, ids, &pieces) == std::string("a") + kFFFD);
        CHECK(pieces == std::vector<std::string>{"a", "", "", kFFFD});
        CHECK(decode(t, ids) == std::string("a") + kFFFD);
    }
    SUBCASE("a broken sequence is replaced as soon as the breaking byte arrives") {
        std::vector<std::string> pieces;
        std::vector<uint32_t> ids{byte(0xE2), byte(0x96), uint32_t(t.find("a"))};
        CHECK(stream_all(t, ids, &pieces) == std::string(kFFFD) + "a");
        CHECK(pieces == std::vector<std::string>{"", "", std::string(kFFFD) + "a", ""});
    }
    SUBCASE("stray 0xFF bytes give one U+FFFD each, immediately") {
        std::vector<std::string> pieces;
        std::vector<uint32_t> ids{byte(0xFF), byte(0xFF)};
        CHECK(stream_all(t, ids, &pieces) == std::string(kFFFD) + kFFFD);
        CHECK(pieces == std::vector<std::string>{kFFFD, kFFFD, ""});
        CHECK(decode(t, ids) == std::string(kFFFD) + kFFFD);
    }
    SUBCASE("U+2581 spelled with byte pieces also decodes to a space") {
        std::vector<uint32_t> ids{uint32_t(t.find("a")), byte(0xE2), byte(0x96), byte(0x81)};
        CHECK(decode(t, ids) == "a ");
        CHECK(stream_all(t, ids) == "a ");
    }
    SUBCASE("a control token first still lets the first real leading space drop") {
        std::vector<std::string> pieces;
        std::vector<uint32_t> ids{t.bos_id(), meta, meta, uint32_t(t.find("a"))};
        CHECK(stream_all(t, ids, &pieces) == " a");
        CHECK(pieces == std::vector<std::string>{"", "", " ", "a", ""});
        CHECK(decode(t, ids) == " a");
    }
    SUBCASE("only the very first space is dropped, and only at the start") {
        std::vector<uint32_t> ids{uint32_t(t.find("a")), meta};
        CHECK(stream_all(t, ids) == "a ");
        CHECK(decode(t, ids) == "a ");
    }
    SUBCASE("reset() starts a new stream; finish() without pending text is empty") {
        TextStream ts(t);
        std::string out;
        ts.push(meta, out);
        CHECK(out.empty());
        ts.push(meta, out);
        CHECK(out == " ");
        ts.push(byte(0xE2), out);
        CHECK(out.empty());
        ts.reset();
        ts.push(meta, out);
        CHECK(out.empty());  // leading space of the new stream, the held E2 is gone
        ts.finish(out);
        CHECK(out.empty());
    }
    SUBCASE("out-of-range ids are rejected") {
        TextStream ts(t);
        std::string out;
        CHECK_THROWS_AS(ts.push(t.size(), out), needle::Error);
        uint32_t bad = t.size();
        CHECK_THROWS_AS(t.decode(&bad, 1), needle::Error);
    }
}

TEST_CASE("tokenizer: streaming decode equals decode() on random id sequences") {
    // Random ids mix byte pieces (stray, split and truncated sequences), controls and BPE pieces.
    const Tokenizer &t = named_tokenizer("tok8192");
    std::mt19937 rng(1234);
    std::uniform_int_distribution<uint32_t> any_id(0, t.size() - 1), byte_id(14, 269);
    for (int iter = 0; iter < 2000; ++iter) {
        std::vector<uint32_t> ids(rng() % 12);
        for (uint32_t &id : ids) id = rng() % 2 ? byte_id(rng) : any_id(rng);
        CAPTURE(ids);
        CHECK(stream_all(t, ids) == decode(t, ids));
        CHECK(needle::utf8_valid(decode(t, ids)));
    }
}

TEST_CASE("tokenizer: heap BPE equals the rescanning definition") {
    SUBCASE("fixture vocabularies on text slices") {
        json refs = read_json(kFixtures + "tokenizer_refs.json");
        std::string corpus;
        for (const json &e : refs["refs"]["tok1024"]) corpus += e["text"].get<std::string>() + " ";
        json man = read_json(kFixtures + "refs/needle2/manifest.json");
        for (const json &p : man["prompts"]) corpus += p["text"].get<std::string>();
        std::mt19937 rng(7);
        for (const char *tok : {"tok1024", "tok8192"}) {
            const Tokenizer &t = named_tokenizer(tok);
            for (int iter = 0; iter < 300; ++iter) {
                size_t a = rng() % corpus.size(), len = rng() % 300;
                std::string s = corpus.substr(a, len);
                while (!s.empty() && !needle::utf8_valid(s)) s.pop_back();  // whole code points
                while (!s.empty() && (uint8_t(s[0]) & 0xC0) == 0x80) s.erase(0, 1);
                if (!needle::utf8_valid(s)) continue;
                CAPTURE(s);
                CHECK(encode(t, s) == reference_encode(t, s));
            }
        }
    }
    // Two synthetic vocabularies full of score ties: one with U+2581 inside pieces (the whole
    // segment is merged at once) and one with U+2581 only at piece starts (word-by-word path).
    SUBCASE("synthetic vocabularies") for (bool inner_meta : {true, false}) {
        CAPTURE(inner_meta);
        SynBlob sb = base_blob();
        sb.add(0, kMeta);
        std::mt19937 rng(inner_meta ? 99 : 100);
        const char *alpha[] = {"a", "b", "c", kMeta};
        std::map<std::string, bool> seen;
        for (int k = 0; k < 150; ++k) {  // random 2..4 letter pieces, scores from a tiny set
            std::string s;
            for (size_t n = 2 + rng() % 3, i = 0; i < n; ++i)
                s += alpha[rng() % (inner_meta || i == 0 ? 4 : 3)];
            if (seen[s]) continue;
            seen[s] = true;
            sb.add(-float(rng() % 3), s);
        }
        if (inner_meta) sb.add(-1, std::string("a") + kMeta + kMeta);
        for (const char *a : {"a", "b", "c"}) sb.add(-1, a);
        const Tokenizer t = sb.parse();
        for (int iter = 0; iter < 500; ++iter) {
            std::string s;
            for (size_t n = rng() % 40; n > 0; --n) s += rng() % 5 == 0 ? " " : alpha[rng() % 3];
            CAPTURE(s);
            CHECK(encode(t, s) == reference_encode(t, s));
        }
    }
}

TEST_CASE("tokenizer: encode rules on a synthetic vocabulary") {
    SynBlob sb = base_blob();
    const uint32_t meta = sb.add(0, kMeta);
    const uint32_t a = sb.add(-1, "a"), b = sb.add(-1, "b"), c = sb.add(-1, "c");
    const uint32_t aa = sb.add(-2, "aa");
    const uint32_t ab = sb.add(-5, "ab"), bc = sb.add(-3, "bc");
    const uint32_t ab2 = sb.add(-5, "ab");  // duplicate surface: the higher id wins (§2.6)
    const uint32_t tool = sb.add(0, "<tool", 3);  // a shorter USER_DEFINED marker
    const uint32_t meta_a = sb.add(-4, std::string(kMeta) + "a");
    const Tokenizer t = sb.parse();
    const uint32_t tool_call = uint32_t(t.find("<tool_call>"));
    (void)ab;

    CHECK(t.find("ab") == ab2);
    CHECK(encode(t, "") == std::vector<uint32_t>{});
    CHECK(encode(t, " ") == std::vector<uint32_t>{meta, meta});
    // Highest score first: "bc" (-3) beats "ab" (-5).
    CHECK(encode(t, "abc") == std::vector<uint32_t>{meta_a, bc});
    const uint32_t x = uint32_t(t.find("<0x78>"));
    CHECK(encode(t, "xabc") == std::vector<uint32_t>{meta, x, a, bc});
    CHECK(encode(t, "xab") == std::vector<uint32_t>{meta, x, ab2});
    CHECK(encode(t, "xcab") == std::vector<uint32_t>{meta, x, c, ab2});
    // Ties go to the leftmost pair: "aaa" -> "aa" + "a".
    CHECK(encode(t, "xaaa") == std::vector<uint32_t>{meta, x, aa, a});
    // Markers: longest first; a marker splits segments; "<tool" alone still matches.
    CHECK(encode(t, "b<tool_call>b") == std::vector<uint32_t>{meta, b, tool_call, b});
    CHECK(encode(t, "b<toolb") == std::vector<uint32_t>{meta, b, tool, b});
    // Byte fallback: é = C3 A9.
    CHECK(encode(t, "\xC3\xA9") == std::vector<uint32_t>{meta, uint32_t(t.find("<0xC3>")),
                                                         uint32_t(t.find("<0xA9>"))});
    // CONTROL surfaces are not matched in text.
    std::vector<uint32_t> s_ids = encode(t, "<s>");
    CHECK(std::find(s_ids.begin(), s_ids.end(), t.bos_id()) == s_ids.end());
    // Decode: controls give nothing, one leading space dropped.
    std::vector<uint32_t> d{t.bos_id(), meta, meta_a, t.unk_id(), tool_call};
    CHECK(decode(t, d) == " a<tool_call>");

    SUBCASE("missing byte piece falls back to unk") {
        SynBlob s2 = sb;
        s2.pieces[14 + 0xA9].type = 0;  // <0xA9> becomes an ordinary piece
        s2.pieces[14 + 0xA9].surface = "zz";
        const Tokenizer t2 = s2.parse();
        CHECK(encode(t2, "\xC3\xA9") ==
              std::vector<uint32_t>{meta, uint32_t(t2.find("<0xC3>")), t2.unk_id()});
    }
    SUBCASE("byte_fallback = 0 maps unknown symbols to unk") {
        SynBlob s2 = sb;
        s2.byte_fallback = 0;
        const Tokenizer t2 = s2.parse();
        CHECK(encode(t2, "\xC3\xA9" "a") == std::vector<uint32_t>{meta, t2.unk_id(), a});
    }
    SUBCASE("add_dummy_prefix = 0: no prefix, no dropped space") {
        SynBlob s2 = sb;
        s2.add_dummy_prefix = 0;
        const Tokenizer t2 = s2.parse();
        CHECK(encode(t2, "a b") == std::vector<uint32_t>{a, meta, b});
        CHECK(decode(t2, {meta, a}) == " a");
        CHECK(stream_all(t2, {meta, a}) == " a");
    }
}

TEST_CASE("tokenizer: encode rejects invalid UTF-8 with INVALID_ARGUMENT") {
    const Tokenizer &t = named_tokenizer("tok1024");
    for (std::string bad : {std::string("\xFF"), std::string("ab\xC3"), std::string("\xED\xA0\x80"),
                            std::string("\xC0\xAF"), std::string("x\xF4\x90\x80\x80")}) {
        CAPTURE(bad);
        std::vector<uint32_t> ids;
        try {
            t.encode(bad, ids);
            FAIL("no exception");
        } catch (const needle::Error &e) {
            CHECK(e.code() == NEEDLE_E_INVALID_ARGUMENT);
            CHECK(contains(e.what(), "UTF-8"));
        }
    }
    std::vector<uint32_t> ids;
    t.encode(std::string("a\0b", 3), ids);  // U+0000 is valid UTF-8: a byte piece
    CHECK(ids == std::vector<uint32_t>{uint32_t(t.find(std::string(kMeta) + "a")),
                                       uint32_t(t.find("<0x00>")), uint32_t(t.find("b"))});
}

TEST_CASE("tokenizer: UTF-8 helpers follow Python's replace handler") {
    auto dec = [](const std::string &s) {
        std::string out;
        needle::utf8_decode_replace(s, out, false);
        return out;
    };
    const std::string R = kFFFD;
    CHECK(dec("abc") == "abc");
    CHECK(dec("\xE2\x96") == R);                      // truncated: one U+FFFD
    CHECK(dec("\xF0\x9F\x98") == R);
    CHECK(dec("\xFF\xFE") == R + R);                  // stray bytes: one each
    CHECK(dec("\xED\xA0\x80") == R + R + R);          // surrogate: ED is its own subpart
    CHECK(dec("\xE0\x80\x80") == R + R + R);          // overlong
    CHECK(dec("\xC0\xAF") == R + R);
    CHECK(dec("\xF4\x90\x80\x80") == R + R + R + R);  // > U+10FFFF
    CHECK(dec("\xE2\x96x") == R + "x");
    CHECK(dec("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
    std::string out;
    CHECK(needle::utf8_decode_replace("a\xF0\x9F", out, true) == 2);
    CHECK(out == "a");
    out.clear();
    CHECK(needle::utf8_decode_replace("a\xFF", out, true) == 0);  // invalid, not incomplete
    CHECK(out == "a" + R);
    CHECK(needle::utf8_valid(""));
    CHECK(needle::utf8_valid("\xE2\x96\x81"));
    CHECK_FALSE(needle::utf8_valid("\xE2\x96"));
}

TEST_CASE("tokenizer: malformed blobs are FORMAT errors with specific messages") {
    const SynBlob good = base_blob();
    const uint32_t n = uint32_t(good.pieces.size());
    REQUIRE(format_error(good.bytes(), n) == "");

    SUBCASE("truncated header") {
        auto b = good.bytes();
        b.resize(10);
        CHECK_FORMAT_ERROR(b, n, "24-byte header");
    }
    SUBCASE("n_pieces is zero") { CHECK_FORMAT_ERROR(good.bytes(0), 0, "n_pieces is 0"); }
    SUBCASE("n_pieces != vocab_size") {
        CHECK_FORMAT_ERROR(good.bytes(), n + 1, "!= header vocab_size");
    }
    SUBCASE("n_pieces huge is refused before anything is reserved") {
        CHECK_FORMAT_ERROR(good.bytes(0xFFFFFFFFu), 0xFFFFFFFFu, "4294967295 pieces need");
    }
    SUBCASE("piece length running past the blob") {
        SynBlob s = good;
        s.add(0, "xyz");
        auto b = s.bytes();
        b[b.size() - 5] = 0xFF;  // the last piece's u16 len (before its 3 surface bytes)
        b[b.size() - 4] = 0x7F;  // becomes 0x7FFF
        CHECK_FORMAT_ERROR(b, n + 1, "piece 270: surface of 32767 bytes");
        CHECK_FORMAT_ERROR(b, n + 1, "runs past the end");
    }
    SUBCASE("record header running past the blob") {
        SynBlob s = good;
        s.add(0, "x");  // a 1-byte piece between long ones keeps the 7*n bound satisfied
        auto b = s.bytes();
        b.resize(b.size() - 3);  // cut into piece 270's 8-byte record
        CHECK_FORMAT_ERROR(b, n + 1, "piece 270: ");
        CHECK_FORMAT_ERROR(b, n + 1, "runs past the end");
    }
    SUBCASE("trailing bytes") {
        auto b = good.bytes();
        b.push_back(0);
        CHECK_FORMAT_ERROR(b, n, "1 trailing byte after");  // issue 13: was "1 trailing bytes"
    }
    SUBCASE("bad UTF-8 surface") {
        SynBlob s = good;
        s.add(0, "a\xC3(");
        CHECK_FORMAT_ERROR(s.bytes(), n + 1, "piece 270: surface is not valid UTF-8");
    }
    SUBCASE("empty surface") {
        SynBlob s = good;
        s.add(0, "");
        CHECK_FORMAT_ERROR(s.bytes(), n + 1, "piece 270: empty surface");
    }
    SUBCASE("type 7") {
        SynBlob s = good;
        s.add(0, "q", 7);
        CHECK_FORMAT_ERROR(s.bytes(), n + 1, "piece 270: type 7");
    }
    SUBCASE("NaN score") {
        SynBlob s = good;
        s.add(std::numeric_limits<float>::quiet_NaN(), "q");
        CHECK_FORMAT_ERROR(s.bytes(), n + 1, "piece 270: score is NaN");
    }
    SUBCASE("special id out of range") {
        SynBlob s = good;
        s.unk = n;
        CHECK_FORMAT_ERROR(s.bytes(), n, "unk_id 270 is out of range");
        s = good;
        s.bos = 0xFFFFFFFFu;
        CHECK_FORMAT_ERROR(s.bytes(), n, "bos_id 4294967295 is out of range");
    }
    SUBCASE("bad flag byte") {
        SynBlob s = good;
        s.byte_fallback = 2;
        CHECK_FORMAT_ERROR(s.bytes(), n, "flags must be 0 or 1");
    }
    SUBCASE("bad byte piece <0xZZ>") {
        SynBlob s = good;
        s.pieces[14 + 0x41].surface = "<0xZZ>";
        CHECK_FORMAT_ERROR(s.bytes(), n, "piece 79: BYTE piece surface \"<0xZZ>\" is not <0xNN>");
        s.pieces[14 + 0x41].surface = "<0x041>";
        CHECK_FORMAT_ERROR(s.bytes(), n, "piece 79: BYTE piece");
    }
    SUBCASE("lower-case hex digits are accepted") {
        SynBlob s = good;
        s.pieces[14 + 0xAB].surface = "<0xab>";
        CHECK(format_error(s.bytes(), n) == "");
    }
    SUBCASE("duplicated byte") {
        SynBlob s = good;
        s.add(0, "<0x41>", 4);
        CHECK_FORMAT_ERROR(s.bytes(), n + 1, "piece 270: byte 0x41 already defined by piece 79");
    }
    SUBCASE("missing chat marker") {
        SynBlob s = good;
        s.pieces[6].type = 0;  // <think> as a NORMAL piece does not count
        CHECK_FORMAT_ERROR(s.bytes(), n, "chat marker <think> is missing");
        s = good;
        s.pieces[13].surface = "</tool_resul>";
        CHECK_FORMAT_ERROR(s.bytes(), n, "chat marker </tool_result> is missing");
    }
    SUBCASE("every truncation of a real blob is rejected") {
        BlobRef r = tokenizer_blob("tiny");
        for (size_t cut = 0; cut < r.size; cut += 97) {
            std::vector<uint8_t> b(r.data, r.data + cut);
            std::string msg = format_error(b, r.vocab);
            CAPTURE(cut);
            CHECK(contains(msg, "tokenizer: "));
        }
    }
}

TEST_CASE("tokenizer: a default-constructed (absent) tokenizer refuses to encode") {
    const Tokenizer t;
    CHECK(t.size() == 0);
    CHECK(t.find("a") == -1);
    std::vector<uint32_t> ids;
    try {
        t.encode("a", ids);
        FAIL("no exception");
    } catch (const needle::Error &e) {
        CHECK(e.code() == NEEDLE_E_UNSUPPORTED);
    }
    CHECK(t.decode(nullptr, 0).empty());
}
