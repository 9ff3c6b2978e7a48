#include "chat/completion.h"

#include <cstring>

namespace needle {
namespace chat {

void append_token_bytes(const Tokenizer &tok, uint32_t id, std::string &out) {
    const PieceType t = tok.type(id);
    if (t == PieceType::Control || t == PieceType::Unknown) return;
    const std::string_view b = tok.token_bytes(id);
    if (t == PieceType::Byte) {
        out.append(b.data(), b.size());
        return;
    }
    for (size_t i = 0; i < b.size();) {
        if (b.compare(i, 3, "\xE2\x96\x81") == 0) {
            out += ' ';
            i += 3;
        } else {
            out += b[i++];
        }
    }
}

namespace {
// Byte length of a whitespace code point at s[i], or 0.
size_t space_at(const std::string &s, size_t i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    static const char *const kMulti[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8",
                                         "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    for (const char *u : kMulti)
        if (s.compare(i, std::strlen(u), u) == 0) return std::strlen(u);
    // U+2000..U+200A: E2 80 80..8A
    if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
        static_cast<unsigned char>(s[i + 2]) <= 0x8A)
        return 3;
    return 0;
}
// Start of the whitespace run that ends the string (UTF-8 aware: walks code point starts).
size_t trailing_start(const std::string &s, size_t from) {
    size_t end = from, i = from;
    while (i < s.size()) {
        const size_t w = space_at(s, i);
        if (w) {
            i += w;
        } else {
            ++i;
            while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
            end = i;
        }
    }
    return end;
}
}  // namespace

std::string strip_whitespace(const std::string &s) {
    size_t b = 0;
    while (b < s.size()) {
        const size_t w = space_at(s, b);
        if (!w) break;
        b += w;
    }
    return s.substr(b, trailing_start(s, b) - b);
}

Completion parse_completion(const Tokenizer &tok, const MarkerIds &m, const uint32_t *ids, size_t n) {
    Completion c;
    size_t think = n, think_end = n, call = n, call_end = n;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t id = ids[i];
        if (id == m.tool_call && call == n) call = i;
        else if (id == m.tool_call_end && call < n && call_end == n) call_end = i;
        else if (call == n && id == m.think && think == n) think = i;
        else if (call == n && id == m.think_end && think < n && think_end == n) think_end = i;
    }
    if (think < n) {
        // An unclosed think block (budget, or <tool_call> first) runs up to the call or the end.
        const size_t end = think_end < n ? think_end : (call < n ? call : n);
        c.reasoning = strip_whitespace(tok.decode(ids + think + 1, end - think - 1));
    }
    if (call < n) {
        c.call_opened = true;
        c.call_closed = call_end < n;
        c.payload_begin = call + 1;
        c.payload_end = call_end;
        for (size_t i = call + 1; i < call_end; ++i) append_token_bytes(tok, ids[i], c.payload);
    }
    return c;
}

}  // namespace chat
}  // namespace needle
