// The response envelope of one turn (tool-calling.md §7): every field, in the documented order,
// as one UTF-8 JSON object; and the §7.2 fallbacks when it does not fit the caller's buffer.
#pragma once

#include <string>

namespace needle {
namespace chat {

struct Envelope {
    bool respond = false;         // type "respond" (else "call"), §7.1 rule in chat.cpp
    bool success = true;
    std::string error;            // "" -> null
    std::string error_code;       // "" -> null; §7.1 [C] values
    std::string reason;           // "" -> null; [O] "runtime_failure" with truncated
    std::string function_calls = "[]";    // canonical JSON array (§3.3 writer)
    std::string suppressed_calls = "[]";  // canonical JSON array
    std::string reasoning;        // raw UTF-8 (valid: it comes from the detokenizer)
    double confidence = 0.0;      // rounded to 4 decimals when written
    double prefill_tps = 0.0, decode_tps = 0.0, peak_ram_mb = 0.0;  // 1 decimal
    std::string validation;       // "" -> absent; else the §7.3 object's JSON text (validation.h)
};

// Fields in order: type, success, error, error_code, reason, function_calls, suppressed_calls,
// reasoning, confidence, prefill_tps, decode_tps, peak_ram_mb, then validation when set [O].
// Non-ASCII raw (§7.1 [C]).
std::string write_envelope(const Envelope &e);

// Sets success false and the error fields. code "truncated" also sets reason "runtime_failure"
// [O]; every other failure gets reason "runtime_failure" too, so a failed turn never has a null
// reason ([C]: the official runner's only sample pairs failure with that reason).
void set_failure(Envelope &e, const char *code, std::string message);

// The official truncation text [O].
extern const char kTruncatedMessage[];

// §7.2: the minimal envelope written when the real one does not fit the buffer.
std::string buffer_too_small_envelope(size_t needed);

// A JSON string literal of valid UTF-8 text, non-ASCII raw, controls escaped.
void write_json_string_raw(const std::string &s, std::string &out);

// Peak resident set size of the process in MiB (§7.1 [C]); 0 if unknown.
double peak_rss_mib();

}  // namespace chat
}  // namespace needle
