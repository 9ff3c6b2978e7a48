// SentencePiece-BPE tokenizer read from the container's RAW blob.
// Blob layout and validation: container-v2.md §9, §12.6 (rules 25-29).
// Encoding/decoding semantics: tokenizer-and-prompt.md §2 (RefTokenizer.encode) and §3
// (RefTokenizer.decode); §4 explains why RefTokenizer, not real sentencepiece, is followed.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>

#include "core/bytes.h"
#include "core/error.h"

namespace needle {

namespace {

constexpr uint32_t kNone = UINT32_MAX;
constexpr size_t kBlobHeaderBytes = 24;   // container-v2.md §9
constexpr size_t kRecordHeaderBytes = 7;  // f32 score, u8 type, u16 len
constexpr char kMetaSpace[] = "\xE2\x96\x81";  // U+2581, stands for a space (§1)
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The ten chat markers the engine needs (tokenizer-and-prompt.md §1, rule 29).
constexpr const char *kChatMarkers[10] = {
    "<|im_start|>", "<|im_end|>", "<think>",     "</think>",     "<tools>",
    "</tools>",     "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>",
};

// ---------------------------------------------------------------------------------------------
// UTF-8 scanning. One classifier serves validation, Python-"replace" decoding and the streaming
// decoder's hold-back, so all three agree on where a sequence starts, ends and breaks.

enum class SeqKind { Valid, Invalid, Truncated };
struct Seq {
    SeqKind kind;
    size_t len;  // Valid: sequence length; Invalid: maximal subpart (>= 1); Truncated: bytes left
};

// Classifies the sequence starting at p[0] (n >= 1 bytes available) following the Unicode
// well-formed table (no overlongs, no surrogates, <= U+10FFFF). An ill-formed sequence's
// "maximal subpart" is the longest prefix that could still have started a valid sequence;
// Python's "replace" handler turns exactly that prefix into one U+FFFD (§3.2).
Seq classify(const unsigned char *p, size_t n) {
    const unsigned b0 = p[0];
    if (b0 < 0x80) return {SeqKind::Valid, 1};
    size_t need;  // continuation bytes
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 == 0xE0) {
        need = 2, lo = 0xA0;  // no overlongs
    } else if (b0 >= 0xE1 && b0 <= 0xEF) {
        need = 2;
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 == 0xF0) {
        need = 3, lo = 0x90;  // no overlongs
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
        need = 3;
    } else if (b0 == 0xF4) {
        need = 3, hi = 0x8F;  // <= U+10FFFF
    } else {
        return {SeqKind::Invalid, 1};  // 80..C1, F5..FF can never start a sequence
    }
    for (size_t k = 1; k <= need; ++k) {
        if (k >= n) return {SeqKind::Truncated, k};
        const unsigned b = p[k];
        if (b < lo || b > hi) return {SeqKind::Invalid, k};
        lo = 0x80, hi = 0xBF;
    }
    return {SeqKind::Valid, need + 1};
}

// Byte offset of the first ill-formed sequence, or npos.
size_t utf8_first_invalid(std::string_view s) {
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t i = 0;
    while (i < s.size()) {
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        Seq q = classify(p + i, s.size() - i);
        if (q.kind != SeqKind::Valid) return i;
        i += q.len;
    }
    return std::string_view::npos;
}

// Replaces every U+2581 with a space, in place (never grows, so never allocates). §3.3.
void replace_meta_space(std::string &s) {
    size_t w = 0;
    for (size_t r = 0; r < s.size();) {
        if (s.compare(r, 3, kMetaSpace, 3) == 0) {
            s[w++] = ' ';
            r += 3;
        } else {
            s[w++] = s[r++];
        }
    }
    s.resize(w);
}

size_t lead_length(unsigned char b) {  // only for already-validated text
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

uint64_t hash_bytes(std::string_view s) {  // FNV-1a, 64-bit
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Byte value of a `<0xNN>` surface (rule 28: exactly 6 bytes, hex digits of either case), or -1.
int byte_piece_value(std::string_view s) {
    if (s.size() != 6 || s.compare(0, 3, "<0x") != 0 || s[5] != '>') return -1;
    int hi = hex_value(s[3]), lo = hex_value(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

[[noreturn]] void bad_blob(const std::string &message) { fail(NEEDLE_E_FORMAT, message); }

}  // namespace

bool utf8_valid(std::string_view s) { return utf8_first_invalid(s) == std::string_view::npos; }

size_t utf8_decode_replace(std::string_view bytes, std::string &out, bool hold_incomplete) {
    const auto *p = reinterpret_cast<const unsigned char *>(bytes.data());
    const size_t n = bytes.size();
    size_t i = 0;
    while (i < n) {
        // Copy runs of well-formed text in one append.
        size_t run = i;
        Seq q{SeqKind::Valid, 0};
        while (run < n) {
            if (p[run] < 0x80) {
                ++run;
                continue;
            }
            q = classify(p + run, n - run);
            if (q.kind != SeqKind::Valid) break;
            run += q.len;
        }
        out.append(bytes.data() + i, run - i);
        i = run;
        if (i == n) break;
        if (q.kind == SeqKind::Truncated && hold_incomplete) return n - i;  // q.len == n - i
        out.append(kReplacement, 3);
        i += q.len;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Blob parsing (container-v2.md §9, rules 25-29 of §12.6, checked in that order).

Tokenizer Tokenizer::parse(const uint8_t *blob, size_t nbytes, uint32_t vocab_size) {
    // Rule 25: header present, piece count sane, and the count bounded by the blob size before
    // anything is reserved from it (each record needs at least 7 bytes).
    if (blob == nullptr || nbytes < kBlobHeaderBytes)
        bad_blob(strf("tokenizer: blob is %zu byte%s, shorter than its %zu-byte header", nbytes, plural(nbytes),
                      kBlobHeaderBytes));
    const uint32_t n_pieces = read_u32(blob);
    if (n_pieces == 0) bad_blob("tokenizer: n_pieces is 0");
    if (n_pieces != vocab_size)
        bad_blob(strf("tokenizer: n_pieces %u != header vocab_size %u", n_pieces, vocab_size));
    if (uint64_t(n_pieces) * kRecordHeaderBytes > uint64_t(nbytes - kBlobHeaderBytes))
        bad_blob(strf("tokenizer: %u piece%s need at least %llu record bytes but the blob has %zu",
                      n_pieces, plural(n_pieces), (unsigned long long)(uint64_t(n_pieces) * kRecordHeaderBytes),
                      nbytes - kBlobHeaderBytes));

    if (nbytes > UINT32_MAX)  // surfaces are indexed by 32-bit offsets
        bad_blob(strf("tokenizer: blob of %zu bytes is larger than 4 GiB", nbytes));
    Tokenizer t;
    t.pad_ = read_u32(blob + 4);
    t.eos_ = read_u32(blob + 8);
    t.bos_ = read_u32(blob + 12);
    t.unk_ = read_u32(blob + 16);
    // The exporter writes both flags as 1 (§9); anything but 0/1 means a damaged header.
    if (blob[20] > 1 || blob[21] > 1)
        bad_blob(strf("tokenizer: flags must be 0 or 1 (add_dummy_prefix %u, byte_fallback %u)",
                      blob[20], blob[21]));
    t.add_dummy_prefix_ = blob[20] != 0;
    t.byte_fallback_ = blob[21] != 0;

    // Rule 26: walk the records, bounds-checking before every read.
    t.pieces_.reserve(n_pieces);
    t.text_.reserve(nbytes - kBlobHeaderBytes - size_t(n_pieces) * kRecordHeaderBytes);
    size_t pos = kBlobHeaderBytes;  // invariant: pos <= nbytes
    for (uint32_t id = 0; id < n_pieces; ++id) {
        if (nbytes - pos < kRecordHeaderBytes)
            bad_blob(strf("tokenizer: piece %u: record header at blob offset %zu runs past the "
                          "end of the %zu-byte blob", id, pos, nbytes));
        const float score = read_f32(blob + pos);
        const uint8_t type = blob[pos + 4];
        const uint16_t len = read_u16(blob + pos + 5);
        pos += kRecordHeaderBytes;
        if (len > nbytes - pos)
            bad_blob(strf("tokenizer: piece %u: surface of %u byte%s at blob offset %zu runs past "
                          "the end of the %zu-byte blob", id, unsigned(len), plural(len), pos, nbytes));
        std::string_view surface(reinterpret_cast<const char *>(blob + pos), len);
        pos += len;
        if (type > 4) bad_blob(strf("tokenizer: piece %u: type %u is not in 0..4", id, type));
        if (std::isnan(score)) bad_blob(strf("tokenizer: piece %u: score is NaN", id));
        if (surface.empty()) bad_blob(strf("tokenizer: piece %u: empty surface", id));
        size_t bad = utf8_first_invalid(surface);
        if (bad != std::string_view::npos)
            bad_blob(strf("tokenizer: piece %u: surface is not valid UTF-8 (byte %zu)", id, bad));
        t.pieces_.push_back(Piece{uint32_t(t.text_.size()), len, PieceType(type), score});
        t.text_ += surface;
    }
    if (pos != nbytes)
        bad_blob(strf("tokenizer: %zu trailing byte%s after the last piece (blob %zu bytes)",
                      nbytes - pos, plural(nbytes - pos), nbytes));

    // Rule 27: special ids index the table.
    const struct { const char *name; uint32_t id; } specials[] = {
        {"pad_id", t.pad_}, {"eos_id", t.eos_}, {"bos_id", t.bos_}, {"unk_id", t.unk_}};
    for (const auto &s : specials)
        if (s.id >= n_pieces)
            bad_blob(strf("tokenizer: %s %u is out of range (n_pieces %u)", s.name, s.id, n_pieces));

    // Rule 28: byte pieces are exactly <0xNN>, each byte value once.
    std::fill(std::begin(t.byte_piece_), std::end(t.byte_piece_), kNone);
    for (uint32_t id = 0; id < n_pieces; ++id) {
        if (t.pieces_[id].type != PieceType::Byte) continue;
        const std::string_view sf = t.surface(id);
        int v = byte_piece_value(sf);
        if (v < 0)
            bad_blob(strf("tokenizer: piece %u: BYTE piece surface \"%.*s\" is not <0xNN>", id,
                          int(std::min<size_t>(sf.size(), 32)), sf.data()));
        if (t.byte_piece_[v] != kNone)
            bad_blob(strf("tokenizer: piece %u: byte 0x%02X already defined by piece %u", id,
                          unsigned(v), t.byte_piece_[v]));
        t.byte_piece_[v] = id;
    }

    // Markers: every USER_DEFINED piece, longest first, ties in table order (§2.4).
    for (uint32_t id = 0; id < n_pieces; ++id)
        if (t.pieces_[id].type == PieceType::UserDefined) t.user_defined_.push_back(id);
    std::stable_sort(t.user_defined_.begin(), t.user_defined_.end(), [&](uint32_t a, uint32_t b) {
        return t.pieces_[a].len > t.pieces_[b].len;
    });
    for (uint32_t id : t.user_defined_)
        t.marker_first_byte_[uint8_t(t.surface(id)[0])] = true;

    // Rule 29: the chat markers exist as USER_DEFINED pieces.
    for (const char *m : kChatMarkers) {
        bool found = std::any_of(t.user_defined_.begin(), t.user_defined_.end(),
                                 [&](uint32_t id) { return t.surface(id) == m; });
        if (!found) bad_blob(strf("tokenizer: chat marker %s is missing (no USER_DEFINED piece)", m));
    }

    t.index_surfaces();
    t.split_at_meta_ = true;
    for (uint32_t id = 0; id < n_pieces; ++id)
        if (t.surface(id).find(kMetaSpace, 1) != std::string_view::npos) t.split_at_meta_ = false;
    return t;
}

// Open-addressing surface index. Inserting in id order and overwriting on an equal surface
// makes the higher id win, as the reference's dict built in id order does (§2.6).
void Tokenizer::index_surfaces() {
    size_t cap = 16;
    while (cap < 2 * pieces_.size()) cap *= 2;
    by_surface_.assign(cap, Slot{kNone, 0});
    const size_t mask = cap - 1;
    for (uint32_t id = 0; id < pieces_.size(); ++id) {
        const std::string_view s = surface(id);
        const uint64_t h = hash_bytes(s);
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            Slot &slot = by_surface_[i];
            if (slot.id == kNone || (slot.tag == uint32_t(h >> 32) && surface(slot.id) == s)) {
                slot = Slot{id, uint32_t(h >> 32)};
                break;
            }
        }
    }
}

int64_t Tokenizer::find(std::string_view surface) const {
    if (by_surface_.empty()) return -1;
    const size_t mask = by_surface_.size() - 1;
    const uint64_t h = hash_bytes(surface);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot &slot = by_surface_[i];
        if (slot.id == kNone) return -1;
        if (slot.tag == uint32_t(h >> 32) && this->surface(slot.id) == surface) return slot.id;
    }
}

// The 256 byte values in order: a BYTE piece's bytes are one of them.
static const char kByteValues[256] = {
#define NEEDLE_B16(h) char(h), char(h + 1), char(h + 2), char(h + 3), char(h + 4), char(h + 5), char(h + 6), \
    char(h + 7), char(h + 8), char(h + 9), char(h + 10), char(h + 11), char(h + 12), char(h + 13), char(h + 14), char(h + 15)
    NEEDLE_B16(0x00), NEEDLE_B16(0x10), NEEDLE_B16(0x20), NEEDLE_B16(0x30), NEEDLE_B16(0x40), NEEDLE_B16(0x50),
    NEEDLE_B16(0x60), NEEDLE_B16(0x70), NEEDLE_B16(0x80), NEEDLE_B16(0x90), NEEDLE_B16(0xA0), NEEDLE_B16(0xB0),
    NEEDLE_B16(0xC0), NEEDLE_B16(0xD0), NEEDLE_B16(0xE0), NEEDLE_B16(0xF0)
#undef NEEDLE_B16
};

std::string_view Tokenizer::token_bytes(uint32_t id) const {
    switch (pieces_[id].type) {
    case PieceType::Normal:
    case PieceType::UserDefined:
        return surface(id);
    case PieceType::Byte:  // parse checked the surface is <0xNN>
        return {kByteValues + byte_piece_value(surface(id)), 1};
    case PieceType::Control:
    case PieceType::Unknown:
        break;  // contribute nothing to decoded text (§3.1)
    }
    return {};
}

// ---------------------------------------------------------------------------------------------
// Encoding (§2).

// Work buffers for one encode() call, reused across its segments. Symbols are indexed by the
// code point they started at; a live symbol covers bytes [start, start + len) of the segment, so
// the concatenation of two neighbours is itself a substring and lookups never build strings.
struct Tokenizer::BpeScratch {
    struct Candidate {
        float score;
        uint32_t left, right;  // symbol indices
        uint32_t len;          // byte length of the merged text, detects stale entries
    };
    // Max-heap order: higher score first, then the leftmost pair (smaller left index). Symbol
    // indices keep their left-to-right order, so this is exactly the rescanning rule of §2.5.
    struct Lower {
        bool operator()(const Candidate &a, const Candidate &b) const {
            if (a.score != b.score) return a.score < b.score;
            return a.left > b.left;
        }
    };
    std::vector<uint32_t> start, len, prev, next;
    std::vector<Candidate> heap;
};

void Tokenizer::encode(std::string_view text, std::vector<uint32_t> &out) const {
    if (pieces_.empty()) fail(NEEDLE_E_UNSUPPORTED, "tokenize: the model has no tokenizer");
    size_t bad = utf8_first_invalid(text);
    if (bad != std::string_view::npos)
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("tokenize: text is not valid UTF-8 (byte %zu)", bad));
    if (text.empty()) return;  // §2.1
    if (text.size() > (size_t(1) << 30))  // keeps every symbol index inside uint32_t
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("tokenize: text of %zu bytes is too long", text.size()));

    // §2.2-2.3: spaces become U+2581, plus one leading U+2581 (dummy prefix).
    std::string esc;
    esc.reserve(text.size() + 3 + 2 * size_t(std::count(text.begin(), text.end(), ' ')));
    if (add_dummy_prefix_) esc += kMetaSpace;
    for (char c : text) {
        if (c == ' ')
            esc += kMetaSpace;
        else
            esc += c;
    }

    // §2.4: split out USER_DEFINED markers (longest first); the text between them is one segment.
    BpeScratch scratch;
    const std::string_view all(esc);
    size_t seg = 0, pos = 0;
    while (pos < all.size()) {
        uint32_t marker = kNone;
        if (marker_first_byte_[uint8_t(all[pos])]) {
            for (uint32_t id : user_defined_) {
                const std::string_view s = surface(id);
                if (all.compare(pos, s.size(), s) == 0) {
                    marker = id;
                    break;
                }
            }
        }
        if (marker == kNone) {
            pos += lead_length(uint8_t(all[pos]));
            continue;
        }
        bpe_segment(all.substr(seg, pos - seg), scratch, out);
        out.push_back(marker);
        pos += pieces_[marker].len;
        seg = pos;
    }
    bpe_segment(all.substr(seg), scratch, out);
}

// §2.5 on one segment. The whole text between two markers is one segment, but when no piece
// contains U+2581 after its first character (checked at parse time; true for every known blob),
// no merge can ever produce a symbol spanning the position just before a U+2581, because every
// merged symbol is a piece surface. Cutting there splits the segment into words whose merges
// are independent: each word sees exactly the subsequence of the whole segment's merges that
// touch it, in the same order (highest score, then leftmost). The result is identical and the
// heap stays word-sized.
void Tokenizer::bpe_segment(std::string_view seg, BpeScratch &sc, std::vector<uint32_t> &out) const {
    if (!split_at_meta_) return bpe_chunk(seg, sc, out);
    size_t begin = 0;
    while (begin < seg.size()) {
        size_t end = seg.find(kMetaSpace, begin + 1, 3);
        if (end == std::string_view::npos) end = seg.size();
        bpe_chunk(seg.substr(begin, end - begin), sc, out);
        begin = end;
    }
}

// Merge adjacent symbols, best-scoring pair first (ties leftmost), using a heap of candidate
// pairs with lazy deletion: an entry is stale once either side has changed, which the adjacency
// and merged-length checks detect. O(n log n) instead of rescanning every round.
void Tokenizer::bpe_chunk(std::string_view seg, BpeScratch &sc, std::vector<uint32_t> &out) const {
    if (seg.empty()) return;
    sc.start.clear(), sc.len.clear(), sc.prev.clear(), sc.next.clear(), sc.heap.clear();
    for (size_t i = 0; i < seg.size();) {
        size_t l = lead_length(uint8_t(seg[i]));
        sc.start.push_back(uint32_t(i));
        sc.len.push_back(uint32_t(l));
        i += l;
    }
    const uint32_t n = uint32_t(sc.start.size());
    for (uint32_t i = 0; i < n; ++i) {
        sc.prev.push_back(i == 0 ? kNone : i - 1);
        sc.next.push_back(i + 1 == n ? kNone : i + 1);
    }

    BpeScratch::Lower lower;
    auto consider = [&](uint32_t a, uint32_t b) {  // a, b adjacent live symbols
        uint32_t l = sc.len[a] + sc.len[b];
        int64_t id = find(seg.substr(sc.start[a], l));
        if (id < 0) return;
        sc.heap.push_back({pieces_[size_t(id)].score, a, b, l});
        std::push_heap(sc.heap.begin(), sc.heap.end(), lower);
    };
    for (uint32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

    while (!sc.heap.empty()) {
        std::pop_heap(sc.heap.begin(), sc.heap.end(), lower);
        const BpeScratch::Candidate c = sc.heap.back();
        sc.heap.pop_back();
        // Current iff `left` is still followed by `right` and neither has grown since the entry
        // was pushed. A dead `left` fails the first test (dead symbols get next = kNone); a
        // `right` that was absorbed by `left` is no longer its next; one that grew fails the
        // length test. So `len` of a dead symbol is never used.
        if (sc.next[c.left] != c.right || sc.len[c.left] + sc.len[c.right] != c.len) continue;
        const uint32_t a = c.left, b = c.right;
        sc.len[a] = c.len;
        sc.next[a] = sc.next[b];
        if (sc.next[b] != kNone) sc.prev[sc.next[b]] = a;
        sc.next[b] = kNone, sc.prev[b] = kNone;  // b is dead
        if (sc.prev[a] != kNone) consider(sc.prev[a], a);
        if (sc.next[a] != kNone) consider(a, sc.next[a]);
    }

    for (uint32_t i = 0; i != kNone; i = sc.next[i]) emit_symbol(seg.substr(sc.start[i], sc.len[i]), out);
}

// §2.5 last bullet: a symbol's id, else its bytes as <0xNN> pieces (a missing byte piece gives
// unk, §4.6), else unk.
void Tokenizer::emit_symbol(std::string_view symbol, std::vector<uint32_t> &out) const {
    int64_t id = find(symbol);
    if (id >= 0) {
        out.push_back(uint32_t(id));
    } else if (byte_fallback_) {
        for (unsigned char b : symbol) out.push_back(byte_piece_[b] != kNone ? byte_piece_[b] : unk_);
    } else {
        out.push_back(unk_);
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding (§3).

std::string Tokenizer::decode(const uint32_t *ids, size_t n) const {
    std::string bytes;
    for (size_t i = 0; i < n; ++i) {
        if (ids[i] >= size())
            fail(NEEDLE_E_INVALID_ARGUMENT,
                 strf("detokenize: token %u at position %zu is out of range (vocab %u)", ids[i], i,
                      size()));
        bytes += token_bytes(ids[i]);
    }
    std::string text;
    text.reserve(bytes.size());
    utf8_decode_replace(bytes, text, false);
    replace_meta_space(text);
    if (add_dummy_prefix_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
    return text;
}

// Streaming: decoding is self-synchronising, so decoding the bytes up to a code point boundary
// gives a prefix of the whole decode. We therefore only hold back a trailing well-started but
// incomplete sequence (it may still complete, or be broken by the next byte, or end the stream
// as one U+FFFD), and resolve the leading-space rule on the first non-empty output.

void TextStream::reset() {
    pending_.clear();
    at_start_ = true;
}

namespace {
void finish_piece(std::string &out, bool &at_start, bool drop_leading_space) {
    replace_meta_space(out);
    if (at_start && !out.empty()) {
        if (drop_leading_space && out[0] == ' ') out.erase(0, 1);
        at_start = false;
    }
}
}  // namespace

void TextStream::push(uint32_t id, std::string &out) {
    out.clear();
    if (id >= tok_->size())
        fail(NEEDLE_E_INVALID_ARGUMENT,
             strf("detokenize: token %u is out of range (vocab %u)", id, tok_->size()));
    std::string_view b = tok_->token_bytes(id);
    if (b.empty()) return;  // CONTROL/UNKNOWN: nothing, and the leading-space rule stays open
    pending_.append(b.data(), b.size());
    size_t held = utf8_decode_replace(pending_, out, true);
    pending_.erase(0, pending_.size() - held);  // keep only the held tail; capacity stays
    finish_piece(out, at_start_, tok_->add_dummy_prefix());
}

void TextStream::finish(std::string &out) {
    out.clear();
    if (pending_.empty()) return;
    utf8_decode_replace(pending_, out, false);  // a dangling sequence -> one U+FFFD
    pending_.clear();
    finish_piece(out, at_start_, tok_->add_dummy_prefix());
}

}  // namespace needle
