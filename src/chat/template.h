// The chat template of Needle 2 (tool-calling.md §3.1, §10.2; tokenizer-and-prompt.md §5) and
// the token-id helpers that cut an encoded prompt at its markers (§3.2, §10.4). Pure text and
// ids: knows nothing of the model or the grammar.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace needle {
namespace chat {

// The static prefix text (§10.3): the optional system turn, then "<|im_start|>user\n<tools>"
// TOOLS "</tools>". No BOS. `tools` is the canonical tools JSON (§3.3).
std::string render_static_prefix(std::string_view system, std::string_view tools);

// What follows the static prefix on the first turn: "\n" QUERY "<|im_end|>\n<|im_start|>assistant\n"
// (§3.1; QUERY raw). static prefix + this = the whole first-turn prompt.
std::string render_first_turn_suffix(std::string_view query);

// How a later turn is rendered (§10.2, UNKNOWN, provisional [C]). The ONE place to change when
// the official rendering is known. The text starts with "<|im_end|>": the previous assistant
// turn's stop token, fed at the start of the next turn (§4 [C]).
enum class TurnKind { ToolResults, FollowUp };
std::string render_later_turn(TurnKind kind, std::string_view text);

// Token ids of the chat markers and the lone dummy-prefix pieces, looked up once per model.
struct MarkerIds {
    uint32_t bos = 2, eos = 1;
    uint32_t im_start = 4, im_end = 5, think = 6, think_end = 7, tools = 8, tools_end = 9;
    uint32_t tool_call = 10, tool_call_end = 11;
    // Ids that encode() puts before a text that starts with a marker (the dummy prefix: the lone
    // U+2581 piece on the needle2 tokenizer, none without add_dummy_prefix).
    std::vector<uint32_t> dummy_prefix;
};
// Throws Error(NEEDLE_E_UNSUPPORTED) when a chat marker is missing from the vocabulary.
MarkerIds marker_ids(const Tokenizer &tok);

// Appends encode(text) without the dummy-prefix ids, for a `text` that starts with a marker and
// continues an already-encoded sequence. Because markers end the BPE segment before them (§3.2),
// encode(a) + encode_continuation(b) == encode(a + b) whenever b starts with a marker.
// Throws Error(NEEDLE_E_INTERNAL) if the encoding does not start as expected.
void encode_continuation(const Tokenizer &tok, const MarkerIds &ids, std::string_view text,
                         std::vector<uint32_t> &out);

}  // namespace chat
}  // namespace needle
