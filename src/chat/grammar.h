// Byte-level grammar of a tool-call payload and its token masks (tool-calling.md §6.3-§6.5).
//
// The schemas compile into a small graph of nodes (literal sets, objects, arrays, strings,
// numbers, unions, any-value); a GrammarMatcher walks it as a pushdown automaton with a bounded
// stack of frames, one byte at a time. Token masks are computed by walking a trie of the token
// byte strings with copies of the automaton state, pruning a whole subtree as soon as a prefix
// dies; inside free strings the common "plain text" tokens are admitted from precomputed masks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/grammar_regex.h"
#include "chat/json.h"
#include "tokenizer/tokenizer.h"

namespace needle {
namespace chat {

// Byte string of every token id (§6.5), built once per model, plus the tries the matcher walks.
class TokenBytes {
public:
    explicit TokenBytes(const Tokenizer &tok);
    uint32_t size() const { return uint32_t(bytes_.size()); }
    std::string_view bytes(uint32_t id) const { return bytes_[id]; }  // empty for CONTROL / UNKNOWN
    bool is_marker(uint32_t id) const { return marker_[id] != 0; }   // CONTROL, UNKNOWN or USER_DEFINED
    int64_t end_call_id() const { return end_call_; }                 // "</tool_call>", or -1

    // Internal: a trie over the byte strings of the non-marker tokens. Children of a node are
    // contiguous and sorted by byte; tokens ending at a node are contiguous too.
    struct Trie {
        struct Node { uint32_t child_begin, child_end, tok_begin, tok_end; };
        std::vector<Node> nodes;        // nodes[0] = root
        std::vector<uint8_t> child_byte;
        std::vector<uint32_t> child_node;
        std::vector<uint32_t> tokens;
        uint32_t max_depth = 0;         // longest byte string
    };
    const Trie &full_trie() const { return full_; }        // every non-marker, non-empty token
    const Trie &special_trie() const { return special_; }  // the tokens that are not plain text
    // plain text tokens (valid complete UTF-8, no '"', '\\' or byte < 0x20) of at most n code
    // points, n <= kPlainMax; plain_any(): every plain text token. Mask words: words().
    static constexpr uint32_t kPlainMax = 32;
    const uint64_t *plain_upto(uint32_t n) const { return plain_.data() + size_t(n) * words_; }
    uint32_t words() const { return words_; }

private:
    std::vector<std::string> bytes_;
    std::vector<uint8_t> marker_;
    int64_t end_call_ = -1;
    Trie full_, special_;
    std::vector<uint64_t> plain_;  // (kPlainMax + 1) masks: [n] = plain tokens of <= n code points
    uint32_t words_ = 0;
};

struct GrammarOptions {
    bool require_required = true;  // §6.4: '}' only once every required key appeared
    bool require_call = false;     // tool_choice "required": the refusal "[]" is not offered
};

namespace gram {
constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kMaxFrames = 64;        // matcher stack
constexpr uint32_t kMaxSchemaDepth = 24;   // nested schemas compiled (deeper: compile error)
constexpr uint32_t kMaxProperties = 64;    // per object schema (seen keys are a 64-bit set)
constexpr uint32_t kBoundedDigits = 15;    // digits of a number with a range (exact in binary64)
enum class Kind : uint8_t { Calls, LitSet, Object, AnyObject, Array, String, Number, Any, Union };
// A union dispatches on the first byte: string, object, array, number, boolean, null.
enum Class : uint8_t { kStr, kObj, kArr, kNum, kBool, kNull, kClasses };
struct Prop { uint32_t node; bool required; std::string key; };
struct Node {
    Kind kind = Kind::Any;
    uint32_t lit_begin = 0, lit_end = 0;    // LitSet: alternatives in Grammar::lits_ (sorted)
    uint32_t keys = kNone;                  // Object: LitSet node of "key": literals
    std::vector<Prop> props;                // Object (slot = index)
    uint64_t required = 0;                  // Object: slots that must appear before '}'
    uint32_t items = kNone;                 // Array
    uint32_t min_count = 0, max_count = UINT32_MAX;  // Array items / String code points
    bool integer = false, bounded = false;  // Number
    double lo = 0, hi = 0;                  // Number range (integer: inclusive integer bounds)
    bool lo_inc = true, hi_inc = true;
    uint32_t by_class[kClasses] = {kNone, kNone, kNone, kNone, kNone, kNone};  // Union
    bool single = false;                    // Calls: one tool -> at most one call
    bool require_call = false;              // Calls: no "[]"
    // Post-decode checks (§6.4): pattern fallback, format, multipleOf, uniqueItems.
    std::string pattern, format;
    uint32_t dfa = kNone;                   // String: pattern compiled into the grammar (else post_check)
    double multiple_of = 0;
    bool unique = false;
};
struct Lit { std::string bytes; uint32_t payload; };
// Can the matcher write some value of a bounded number in [lo, hi] (inclusive per flag)? A
// bounded number has at most kBoundedDigits digits in all and no exponent, so its magnitude is
// below 10^15 and its finest step 10^-14; an integer range is first narrowed to integer bounds
// (as the compiler does). Values are compared as the matcher compares them (digits / 10^j).
// False e.g. for "minimum": 1e19 or 1e400, or a number range inside (0, 1e-14).
bool range_writable(bool integer, double lo, bool lo_inc, double hi, bool hi_inc);
// Is some integer m in [A, B] (0 <= A <= B < 10^15, or -B <= A for range_writable) such that the
// value (neg ? -m : m) / 10^frac, computed as the matcher computes it, lies in the node's range?
// The test behind both range_writable and the matcher's prefix pruning (§6.4).
bool grid_hit(const Node &n, double A, double B, uint32_t frac, bool neg);
}  // namespace gram

// The CALLS language of §6.4 over the given tools (each an Object with a String "name"; the
// caller validated that). Compiled once per tool selection.
class Grammar {
public:
    // Throws needle::Error(NEEDLE_E_INVALID_ARGUMENT) for a schema nested deeper than
    // gram::kMaxSchemaDepth or an object schema with more than gram::kMaxProperties properties.
    static std::shared_ptr<const Grammar> compile(const std::vector<const JsonValue *> &tools,
                                                  const GrammarOptions &opt);

    // Internal (matcher, post_check).
    std::vector<gram::Node> nodes_;
    std::vector<gram::Lit> lits_;
    std::vector<PatternDfa> dfas_;
    std::vector<std::string> tool_names_;   // grammar tools (payload of the call literal)
    std::vector<uint32_t> tool_params_;     // their arguments node
    uint32_t root_ = 0, any_ = 0;
    // Leaves of "any JSON value" by first byte: string, object, array, number, true/false/null.
    uint32_t any_string_ = 0, any_object_ = 0, any_array_ = 0, any_number_ = 0, any_lit_ = 0;
};

// One walk through a CALLS payload (the text between <tool_call> and </tool_call>).
// Scratch is sized at construction: fill_mask / accept allocate nothing.
class GrammarMatcher {
public:
    GrammarMatcher(std::shared_ptr<const Grammar> g, const TokenBytes &tokens);
    ~GrammarMatcher();
    void reset();
    // Sets bit id (mask[id / 64] >> id % 64) iff token id may come next; clears the rest
    // (mask: (size() + 63) / 64 words). Returns how many are set (0 would be an engine bug:
    // error_code "internal"). Once complete(), only the </tool_call> marker id is allowed.
    size_t fill_mask(uint64_t *mask);
    bool accept(uint32_t id);   // false (state unchanged) if fill_mask would not allow it
    bool complete() const;      // the final ']' has been consumed
    // Feeds raw bytes (tests): false (state unchanged) if the grammar rejects them.
    bool accept_bytes(std::string_view bytes);

    struct State;

private:
    std::shared_ptr<const Grammar> g_;
    const TokenBytes &tok_;
    std::unique_ptr<State[]> states_;   // [0] current, [1] scratch, [2..] one per trie depth
    std::vector<uint32_t> stack_node_, stack_child_;  // DFS over the trie (sized once)
};

// Post-decode checks of §6.4 on the parsed calls array: "" or the violation message.
std::string post_check(const Grammar &g, const JsonValue &calls);

}  // namespace chat
}  // namespace needle
