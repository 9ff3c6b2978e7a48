// Parsing what the model wrote in one assistant turn (tool-calling.md §5): the reasoning between
// <think> and </think>, and the call payload between <tool_call> and </tool_call>. Works on
// token ids, so marker text spelled by ordinary pieces inside a JSON string never cuts a payload.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chat/template.h"
#include "tokenizer/tokenizer.h"

namespace needle {
namespace chat {

struct Completion {
    std::string reasoning;      // §5: think text, leading/trailing whitespace removed; "" if none
    bool call_opened = false;   // a <tool_call> id was generated
    bool call_closed = false;   // ... and its </tool_call>
    std::string payload;        // bytes between them (§6.5 token bytes: U+2581 -> space)
    size_t payload_begin = 0;   // index in `ids` of the first payload token
    size_t payload_end = 0;     // index of </tool_call> (or ids.size() when not closed)
};

// Splits generated ids (stop token excluded). Only the first <tool_call> block counts.
Completion parse_completion(const Tokenizer &tok, const MarkerIds &m, const uint32_t *ids, size_t n);

// The §6.5 byte string of one token: NORMAL / USER_DEFINED surfaces with U+2581 as a space,
// BYTE pieces their byte, CONTROL / UNKNOWN nothing. Appends to `out`.
void append_token_bytes(const Tokenizer &tok, uint32_t id, std::string &out);

// Python's str.strip() for the ASCII whitespace the model writes (space, \t \n \v \f \r) and
// the Unicode separators U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028/9, U+202F, U+205F, U+3000.
std::string strip_whitespace(const std::string &s);

}  // namespace chat
}  // namespace needle
