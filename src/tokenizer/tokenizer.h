// SentencePiece-BPE tokenizer read from the container's RAW blob
// (blob: container-v2.md §9, §12.6; behaviour: tokenizer-and-prompt.md §2-§3, RefTokenizer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace needle {

enum class PieceType : uint8_t { Normal = 0, Unknown = 1, Control = 2, UserDefined = 3, Byte = 4 };

class Tokenizer {
public:
    // Parses and validates the blob (§12.6 rules 25-29). `vocab_size` is the header's.
    // Throws needle::Error(NEEDLE_E_FORMAT) with a specific message.
    static Tokenizer parse(const uint8_t *blob, size_t nbytes, uint32_t vocab_size);

    // Appends the ids of `text` (UTF-8, no BOS) to `out`.
    // Throws needle::Error(NEEDLE_E_INVALID_ARGUMENT) on invalid UTF-8, and
    // NEEDLE_E_UNSUPPORTED on a default-constructed (empty) Tokenizer (a model without a blob).
    void encode(std::string_view text, std::vector<uint32_t> &out) const;

    // Decoded UTF-8 text of `ids` (ids must be < size(); invalid bytes -> U+FFFD, meta-space ->
    // space, one leading space dropped when add_dummy_prefix).
    std::string decode(const uint32_t *ids, size_t n) const;

    // Raw bytes a token contributes before UTF-8 decoding (U+2581 kept as its 3 bytes; a BYTE
    // piece gives its byte; CONTROL/UNKNOWN give nothing). Used by the streaming decoder.
    std::string_view token_bytes(uint32_t id) const;

    uint32_t size() const { return uint32_t(pieces_.size()); }
    uint32_t bos_id() const { return bos_; }
    uint32_t eos_id() const { return eos_; }
    uint32_t pad_id() const { return pad_; }
    uint32_t unk_id() const { return unk_; }
    bool add_dummy_prefix() const { return add_dummy_prefix_; }
    bool byte_fallback() const { return byte_fallback_; }
    PieceType type(uint32_t id) const { return pieces_[id].type; }
    std::string_view surface(uint32_t id) const { return {text_.data() + pieces_[id].offset, pieces_[id].len}; }
    float score(uint32_t id) const { return pieces_[id].score; }
    // Id of the piece with this exact surface (the higher id when duplicated), or -1.
    int64_t find(std::string_view surface) const;

private:
    // 12 bytes a piece, the surfaces in one string: needle2's 8,192 pieces as two std::strings
    // each took 590 KB, whose first touches were half of the tokenizer's share of a model load.
    struct Piece {
        uint32_t offset;  // surface = text_[offset, offset + len)
        uint16_t len;
        PieceType type;
        float score;
    };
    struct BpeScratch;  // per-encode work buffers (tokenizer.cpp)

    std::vector<Piece> pieces_;
    std::string text_;  // every surface, in id order
    // Surface -> id, open addressing over ids (the higher id wins on duplicates, §2.6). Stores
    // ids rather than string keys so lookups of a string_view never allocate and a copied
    // Tokenizer never points into another object's strings.
    struct Slot {
        uint32_t id;   // UINT32_MAX = empty
        uint32_t tag;  // high hash bits: most mismatches are rejected without touching pieces_
    };
    std::vector<Slot> by_surface_;  // size power of two
    std::vector<uint32_t> user_defined_;  // marker ids, longest surface first (ties: table order)
    bool marker_first_byte_[256] = {};    // quick reject before trying the markers
    uint32_t byte_piece_[256] = {};       // id of <0xNN>, or UINT32_MAX (set by parse)
    uint32_t pad_ = 0, eos_ = 1, bos_ = 2, unk_ = 3;
    bool add_dummy_prefix_ = true, byte_fallback_ = true;
    bool split_at_meta_ = false;  // no piece has U+2581 after its start: BPE word by word

    void index_surfaces();
    void bpe_segment(std::string_view segment, BpeScratch &scratch, std::vector<uint32_t> &out) const;
    void bpe_chunk(std::string_view chunk, BpeScratch &scratch, std::vector<uint32_t> &out) const;
    void emit_symbol(std::string_view symbol, std::vector<uint32_t> &out) const;
};

// Streaming detokenizer: feed generated ids one at a time, get back the text each completes,
// whole code points only. The concatenation of every piece plus finish() equals
// Tokenizer::decode() of all ids. Holds at most one incomplete UTF-8 sequence.
class TextStream {
public:
    explicit TextStream(const Tokenizer &tok) : tok_(&tok) {}
    void reset();
    // Appends the newly completed text to `out` (cleared first). No allocation once `out` and
    // the internal buffers have grown to a few dozen bytes.
    void push(uint32_t id, std::string &out);
    // Flushes a dangling incomplete sequence as U+FFFD.
    void finish(std::string &out);

private:
    const Tokenizer *tok_;
    std::string pending_;  // bytes of an incomplete code point
    bool at_start_ = true; // leading-space rule not yet resolved
};

// UTF-8 helpers shared by tokenizer and API.
bool utf8_valid(std::string_view s);
// Decodes bytes with Python's "replace" handling (maximal subpart -> one U+FFFD each).
// Appends to `out`. When `hold_incomplete` is true, a trailing well-started but incomplete
// sequence is not decoded; its length is returned so the caller can keep those bytes.
size_t utf8_decode_replace(std::string_view bytes, std::string &out, bool hold_incomplete);

}  // namespace needle
