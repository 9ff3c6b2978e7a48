// The serving layer's call validation and suppression (tool-calling.md §7.1, §7.3).
//
// The official rule is UNKNOWN (§7.3); this is our [C] layer, OFF by default (the spec says
// "optional, default-off"), switched by needle_chat_params.validation. When on, a turn whose
// model output parsed into at least one call gets the official field layout
//   "validation": {"ungrounded": ["tool.argument", ...], "negation": bool}
// after peak_ram_mb, and (mode Suppress) calls that fail validation move from function_calls to
// suppressed_calls, each element {"name", "arguments", "reason"}: never dropped silently.
//
// [C] rules, chosen to reproduce the 21 official Needle 3 records of §7.3:
//   * grounded numbers of the user's text (every turn since the static prefix): numbers written
//     with digits (90, 2.5, 1,000, -3) and English number words, alone and combined ("three",
//     "twenty-five", "one hundred and five"); no unit arithmetic ("five minutes" does not
//     ground 300);
//   * ungrounded: an argument holding a JSON number (at any depth of its value; path
//     "tool.arg" or "tool.arg.sub") equal to no grounded number. Strings, booleans and null are
//     never flagged (the records never flag enum strings);
//   * negation: the text contains a negation word (not, no, never, don't and other n't forms,
//     without). Reported only: the records show no call withheld for it, and "don't forget
//     to..." would be a false refusal;
//   * suppressed: a call with an ungrounded argument when the text states no number at all
//     (no digit, no number word, no numeric cue such as "mute"): the model invented the value.
//     The records' four withheld calls are exactly these; "Mute yourself." (level 0) was kept.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/json.h"

namespace needle {
namespace chat {

enum class ValidationMode : int32_t { Off = 0, Suppress = 1, Annotate = 2 };

// What the text states (exposed for tests).
struct StatedNumbers {
    std::vector<double> values;  // every grounded number
    bool any_cue = false;        // a digit, a number word or a numeric cue word appeared
};
StatedNumbers stated_numbers(std::string_view text);
bool states_negation(std::string_view text);

// The outcome for one parsed call list (an array of {"name", "arguments"} objects).
struct ValidationResult {
    std::string function_calls;    // canonical JSON array of the kept calls
    std::string suppressed_calls;  // canonical JSON array of {"name","arguments","reason"}
    std::string validation;        // the "validation" object, JSON text
};

// Validates `calls` against `user_text` (§7.3 [C] above). Annotate mode never suppresses.
// The depth of the walk over argument values is bounded by the parsed value's own depth limit.
ValidationResult validate_calls(const JsonValue &calls, std::string_view user_text, ValidationMode mode);

}  // namespace chat
}  // namespace needle
