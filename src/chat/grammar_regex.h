// JSON Schema `pattern` (ECMAScript subset, tool-calling.md §6.4) compiled to a DFA over code
// points, for the string frames of the grammar. Subset: literals and escapes (\t \n \r \v \f
// \0 \xHH \uHHHH, identity escapes), `.`, classes [...] with ranges and negation, \d \w \s
// \D \W \S, groups (...) and (?:...), alternation, * + ? {n} {n,} {n,m} (lazy forms too), ^ as
// the first and $ as the last character. Anything else (backreferences, lookaround, \b, flags,
// anchors elsewhere, more than kMaxDfaStates states) is not compiled: the string stays free and
// post_check tests the pattern after decoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace needle {
namespace chat {

struct PatternDfa {
    static constexpr uint16_t kDead = 0xFFFF;
    static constexpr uint32_t kMaxDfaStates = 512;
    std::vector<uint32_t> bounds;   // class c covers code points [bounds[c], bounds[c + 1])
    std::vector<uint16_t> next;     // [state * classes() + c]: next state or kDead (pruned: only
                                    // states from which an accepting state is reachable)
    std::vector<uint8_t> accept;    // per state
    std::vector<uint32_t> mindist;  // per state: fewest code points to an accepting state
    uint16_t start = 0;

    uint32_t classes() const { return uint32_t(bounds.size() - 1); }
    uint32_t class_of(uint32_t cp) const;  // binary search
    // Some code point in [lo, hi] leads from state q to a live state reachable within `room`
    // more code points (the transition included) of an accepting state.
    bool any_live(uint16_t q, uint32_t lo, uint32_t hi, uint32_t room) const;
};

// Largest count a {n} {n,} {n,m} quantifier may give. Counting n exactly takes at least n + 1
// DFA states (kMaxDfaStates = 512), so a larger count can never become part of the grammar;
// and std::regex, the post-decode fallback, wraps counts past 32 bits (a{4294967296} became
// a{0}) and gives up near 100000 states. So a pattern with a larger count is refused at create
// rather than left unenforced.
constexpr uint32_t kMaxPatternRepeat = 500;

// Compiles `pattern`; false (dfa untouched) if it is outside the subset or too large. When the
// pattern must be refused outright (a quantifier count above kMaxPatternRepeat, anywhere in the
// pattern, in the subset or not) `refusal`, if given, receives why, e.g. "repeat count 1000000
// exceeds the limit of 500"; otherwise it is cleared.
bool compile_pattern(const std::string &pattern, PatternDfa &dfa, std::string *refusal = nullptr);

}  // namespace chat
}  // namespace needle
