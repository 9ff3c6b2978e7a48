// Strict checks of a tools list at needle_chat_create (tool-calling.md §2, §3.3, §6.4 [C]).
//
// The grammar compiler treats an unsatisfiable schema leniently (an optional key it cannot
// write is dropped, a tool whose required key cannot be written is unreachable). At create we
// refuse such a schema instead, so the author learns of the mistake rather than getting a tool
// the model can never call (or, for a lone tool, a grammar whose only sentence is "[]").
//
// Refused (INVALID_ARGUMENT, "chat: tool I ("NAME"): PATH: problem"), where the spec is silent:
//   * an empty "name";
//   * "enum": [] ;
//   * a numeric range no value satisfies: minimum > maximum, and the exclusive forms (for
//     "type": "integer" also a range with no integer in it, e.g. 1.2 .. 1.8);
//   * a numeric range, for "type" "integer" or "number" (alone or in a list, no enum/const),
//     with no value the grammar can write: a bounded number has at most gram::kBoundedDigits
//     digits and no exponent, so e.g. "minimum": 1e19 or 1e400 (the grammar would drop the type
//     and every call needing it: each turn ended "internal" before the drop was added);
//   * "multipleOf" that is not a number > 0, or a finite range holding no multiple of it
//     (e.g. multipleOf 5 with minimum 1, maximum 4: every call failed the post-decode check);
//   * minLength > maxLength, minItems > maxItems;
//   * a "pattern" with a {n} {n,} {n,m} count above kMaxPatternRepeat (grammar_regex.h: no
//     grammar can enforce it, std::regex wraps it past 32 bits), subset or not;
//   * a "pattern" that is not a valid ECMAScript regular expression (neither our compiler nor
//     std::regex accepts it: the post-decode check could never pass), or longer than
//     kMaxPatternBytes / nested deeper than kMaxPatternNesting (std::regex recurses), or one our
//     compiler proves matches no string (within maxLength).
// Accepted, because the spec says so: duplicate names (§6.4: the first definition is the
// grammar's, all are rendered); patterns outside our subset (§6.4: checked after decoding).
// The walk follows what the grammar compiles (properties, items), at most gram::kMaxSchemaDepth
// deep (deeper schemas are refused by the grammar compiler itself).
#pragma once

#include <cstddef>

#include "chat/json.h"

namespace needle {
namespace chat {

constexpr size_t kMaxPatternBytes = 4096;
constexpr size_t kMaxPatternNesting = 64;

// Throws needle::Error(NEEDLE_E_INVALID_ARGUMENT) naming the tool index, name, path and problem.
void check_tool_strict(const JsonValue &tool, size_t index);

}  // namespace chat
}  // namespace needle
