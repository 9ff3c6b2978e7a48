// JSON as Python's json.loads reads it and json.dumps(separators=(",", ":")) writes it
// (tool-calling.md §3.3). Used for the tools list, the calls payload and tool results.
//
// Own iterative parser rather than nlohmann's: Python accepts lone-surrogate escapes and the
// NaN / Infinity / -Infinity literals, which nlohmann rejects, and the canonical form needs
// each number's original text anyway. Iterative (explicit stack), so nesting depth costs heap,
// not C stack, and is refused past JsonLimits::max_depth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace needle {
namespace chat {

// A JSON value as Python's json.loads sees it (tool-calling.md §3.3).
struct JsonValue {
    enum class Kind : uint8_t { Null, False, True, Int, Float, String, Array, Object };
    Kind kind = Kind::Null;
    std::string text;   // Int: Python int digits ("-0" -> "0"); Float: Python repr ("100.0",
                        // "1e-05", "Infinity", "NaN"); String: decoded text (UTF-8; a lone
                        // surrogate escape kept so the writer gives it back unchanged)
    double number = 0;  // Int / Float as a double (Int may be inexact past 2^53)
    std::vector<JsonValue> items;                            // Array
    std::vector<std::pair<std::string, JsonValue>> members;  // Object: first position, last value
    const JsonValue *find(std::string_view key) const;       // Object member or nullptr
};

// Limits checked before anything is allocated from the input. The value's nesting depth bounds
// every recursion over it (destructor included), so keep max_depth small.
struct JsonLimits {
    uint32_t max_depth = 64;                 // arrays/objects nested (the top level is depth 1)
    size_t max_bytes = size_t(16) << 20;     // input length
    size_t max_values = size_t(1) << 21;     // scalars + containers (bounds memory: ~100 B each)
};

// Throws needle::Error(NEEDLE_E_INVALID_ARGUMENT, specific message with the byte offset) on
// invalid JSON / UTF-8 / depth or size over the limits. Never recurses.
// A lone surrogate escape (\ud800) is stored as its 3-byte generalized-UTF-8 form (ED A0 80),
// which write_canonical_string turns back into the escape.
JsonValue parse_json(std::string_view utf8, const JsonLimits &limits = {});

// Elements of a top-level JSON array, counted by one scan that allocates nothing (commas at
// depth 1 outside strings), so a caller can refuse a huge list before parsing it. Only a bound
// for a valid array; 0 when the text does not start with '[' (the parser then says why).
size_t count_array_items(std::string_view json);

// Appends json.dumps(v, separators=(",", ":"), ensure_ascii=True) of v (§3.3). Iterative.
// strict_json: write NaN / Infinity / -Infinity as null, so the text is RFC 8259 JSON (what the
// envelope must be, §7.1 [C]); the prompt's tools block keeps Python's literals.
void write_canonical(const JsonValue &v, std::string &out, bool strict_json = false);

// Whether v holds a NaN or infinite number anywhere (iterative).
bool has_non_finite(const JsonValue &v);

// Appends the §3.3 JSON string literal (with quotes) of a decoded string. Bytes that are not
// (generalized) UTF-8 are written as \ufffd.
void write_canonical_string(std::string_view decoded, std::string &out);

// Python repr of a binary64 (§3.3): "100.0", "1e-05", "1e+16", "-0.0", "Infinity", "NaN".
std::string python_float_repr(double d);

}  // namespace chat
}  // namespace needle
