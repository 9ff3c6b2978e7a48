// Strict tools-list checks at needle_chat_create (src/chat/tool_checks.h): unsatisfiable
// schemas are refused with INVALID_ARGUMENT and a message naming tool, path and problem; what
// the spec accepts (duplicate names, patterns outside our subset) still creates.
#include <doctest/doctest.h>

#include <string>

#include "chat_util.h"

using namespace chat_test;

namespace {

// A tool list of one tool "t" (after a valid tool "ok", so the index is 1) whose one property
// has schema `prop`.
std::string with_prop(const std::string &prop) {
    return R"([{"name":"ok"},{"name":"t","parameters":{"type":"object","properties":{"v":)" + prop + "}}}]";
}

std::string refusal(const std::string &tools) {
    needle_status st;
    std::string msg;
    Chat c = try_chat(tiny(), tools, params(), st, msg);
    CHECK(st == NEEDLE_E_INVALID_ARGUMENT);
    CHECK(c == nullptr);
    return msg;
}

bool creates(const std::string &tools) {
    needle_status st;
    std::string msg;
    Chat c = try_chat(tiny(), tools, params(), st, msg);
    INFO(msg);
    return st == NEEDLE_OK && c != nullptr;
}

}  // namespace

TEST_CASE("chat tool checks: schemas no value satisfies are refused, naming tool and path") {
    const std::string at = "needle_chat_create: chat: tool 1 (\"t\"): parameters.properties.v: ";
    CHECK(refusal(R"([{"name":"ok"},{"name":""}])") == "needle_chat_create: chat: tool 1 (\"\"): name: the name is empty");
    CHECK(refusal(with_prop(R"({"enum":[]})")) == at + "\"enum\" is empty: no value can be written");
    CHECK(refusal(with_prop(R"({"type":"integer","minimum":5,"maximum":3})")) ==
          at + "the range minimum 5, maximum 3 admits no value");
    CHECK(refusal(with_prop(R"({"type":"number","exclusiveMinimum":1.5,"maximum":1.5})")) ==
          at + "the range exclusiveMinimum 1.5, maximum 1.5 admits no value");
    CHECK(refusal(with_prop(R"({"type":"integer","minimum":1.2,"maximum":1.8})")) ==
          at + "the range minimum 1.2, maximum 1.8 admits no value");
    CHECK(refusal(with_prop(R"({"type":"string","minLength":4,"maxLength":2})")) == at + "minLength 4 > maxLength 2");
    CHECK(refusal(with_prop(R"({"type":"array","minItems":3,"maxItems":1})")) == at + "minItems 3 > maxItems 1");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"[a"})")) ==
          at + "\"pattern\" \"[a\" is not a valid regular expression");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"a{2,1}b"})")) ==
          at + "\"pattern\" \"a{2,1}b\" is not a valid regular expression");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^[^\\s\\S]$"})")) ==
          at + "\"pattern\" \"^[^\\s\\S]$\" matches no string");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^abcd$","maxLength":3})")) ==
          at + "no string of at most maxLength 3 code points matches \"pattern\" \"^abcd$\"");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":")" + std::string(70, '(') + "a" + std::string(70, ')') + "\"}")) ==
          at + "\"pattern\" nests groups 70 deep (at most 64)");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":")" + std::string(5000, 'a') + "\"}")) ==
          at + "\"pattern\" of 5000 bytes (at most 4096)");
    CHECK(refusal(with_prop(R"({"type":"number","multipleOf":0})")) == at + "\"multipleOf\" must be a number greater than 0");
    CHECK(refusal(with_prop(R"({"type":"integer","multipleOf":-5})")) == at + "\"multipleOf\" must be a number greater than 0");
    CHECK(refusal(with_prop(R"({"type":"integer","multipleOf":"5"})")) == at + "\"multipleOf\" must be a number greater than 0");
    CHECK(refusal(with_prop(R"({"type":"integer","multipleOf":5,"minimum":1,"maximum":4})")) ==
          at + "the range minimum 1, maximum 4 holds no multiple of 5");
    CHECK(refusal(with_prop(R"({"type":"number","multipleOf":0.25,"minimum":0.3,"maximum":0.45})")) ==
          at + "the range minimum 0.3, maximum 0.45 holds no multiple of 0.25");
    // A lone surrogate is no code point a string can carry: the pattern matches nothing.
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^\udc00$"})")).find("matches no string") != std::string::npos);
    // Nested: inside array items and sub-objects, with the path.
    CHECK(refusal(with_prop(R"({"type":"array","items":{"type":"object","properties":{"w":{"enum":[]}}}})")) ==
          at.substr(0, at.size() - 2) + ".items.properties.w: \"enum\" is empty: no value can be written");
}

TEST_CASE("chat tool checks: what the spec accepts still creates") {
    // §6.4: duplicate names keep the first definition for the grammar (all are rendered).
    CHECK(creates(R"([{"name":"a"},{"name":"a","parameters":{"type":"object"}}])"));
    // §6.4: a valid pattern outside our subset (lookahead) is checked after decoding.
    CHECK(creates(with_prop(R"({"type":"string","pattern":"^(?=E)[A-Z]{3}$"})")));
    // Satisfiable edges: equal bounds, one integer in range, equal counts.
    CHECK(creates(with_prop(R"({"type":"integer","minimum":3,"maximum":3})")));
    CHECK(creates(with_prop(R"({"type":"integer","minimum":1.2,"maximum":2.8})")));
    CHECK(creates(with_prop(R"({"type":"number","minimum":1.5,"maximum":1.5})")));
    CHECK(creates(with_prop(R"({"type":"string","minLength":2,"maxLength":2,"pattern":"^ab$"})")));
    CHECK(creates(with_prop(R"({"type":"array","minItems":1,"maxItems":1})")));
    CHECK(creates(with_prop(R"({"enum":[1]})")));
    // Multiples at the edges (inclusive, within the post-decode check's tolerance).
    CHECK(creates(with_prop(R"({"type":"integer","multipleOf":5,"minimum":5,"maximum":5})")));
    CHECK(creates(with_prop(R"({"type":"number","multipleOf":0.1,"minimum":0.3,"maximum":0.3})")));
    CHECK(creates(with_prop(R"({"type":"number","multipleOf":0.01,"exclusiveMinimum":0})")));
}

TEST_CASE("chat tool checks: pattern repeat counts above the limit are refused by count, without wraparound") {
    const std::string at = "needle_chat_create: chat: tool 1 (\"t\"): parameters.properties.v: ";
    // 2^32 used to wrap to a{0} in std::regex and create; 10^6 was called "not a valid regular
    // expression"; 501 was accepted and left to the post-decode check.
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^a{4294967296}$"})")) ==
          at + "\"pattern\" \"^a{4294967296}$\": repeat count 4294967296 exceeds the limit of 500");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^a{1000000}$"})")) ==
          at + "\"pattern\" \"^a{1000000}$\": repeat count 1000000 exceeds the limit of 500");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"^[0-9]{2,501}$"})")) ==
          at + "\"pattern\" \"^[0-9]{2,501}$\": repeat count 501 exceeds the limit of 500");
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"x{501,}"})")) ==
          at + "\"pattern\" \"x{501,}\": repeat count 501 exceeds the limit of 500");
    // Outside our subset (lookahead first), where std::regex would have taken it: refused too.
    CHECK(refusal(with_prop(R"({"type":"string","pattern":"(?=a)a{18446744073709551617}"})")) ==
          at + "\"pattern\" \"(?=a)a{18446744073709551617}\": repeat count 18446744073709551617 exceeds the limit of 500");
    // At the limit, leading zeros, and braces that are no quantifier (class, escape) create.
    CHECK(creates(with_prop(R"({"type":"string","pattern":"^a{500}$"})")));
    CHECK(creates(with_prop(R"({"type":"string","pattern":"^a{0000500}$"})")));
    CHECK(creates(with_prop(R"({"type":"string","pattern":"^[{1000}]+$"})")));
    CHECK(creates(with_prop(R"({"type":"string","pattern":"^\\{1000\\}$"})")));
}

TEST_CASE("chat tool checks: numeric ranges beyond the digits the grammar writes are refused, naming tool and property") {
    // These created, then every turn ended error_code "internal" ("the grammar allowed no token
    // inside the call"): a bounded number has at most 15 digits and no exponent. Bounds are
    // quoted as the canonical tools text writes them (§3.3: 1e+19, 1e400 -> Infinity).
    const std::string at = "needle_chat_create: chat: tool 1 (\"t\"): parameters.properties.v: ";
    const std::string int_tail = " admits no integer the grammar can write (at most 15 digits, no exponent: magnitude below 1e15)";
    CHECK(refusal(with_prop(R"({"type":"integer","minimum":1e19})")) == at + "the range minimum 1e+19" + int_tail);
    CHECK(refusal(with_prop(R"({"type":"integer","minimum":1e400})")) == at + "the range minimum Infinity" + int_tail);
    CHECK(refusal(with_prop(R"({"type":"integer","maximum":-1e15})")) == at + "the range maximum -1000000000000000.0" + int_tail);
    CHECK(refusal(with_prop(R"({"type":"integer","exclusiveMinimum":999999999999999})")) ==
          at + "the range exclusiveMinimum 999999999999999" + int_tail);
    CHECK(refusal(with_prop(R"({"type":["integer","null"],"minimum":1e18,"maximum":2e18})")) ==
          at + "the range minimum 1e+18, maximum 2e+18" + int_tail);
    CHECK(refusal(with_prop(R"({"type":"number","minimum":1e-20,"maximum":1e-16})")) ==
          at + "the range minimum 1e-20, maximum 1e-16 admits no number the grammar can write (at most 15 "
               "digits, no exponent: magnitude below 1e15, steps of 1e-14)");
    // minimum > maximum keeps its own message (not this one).
    CHECK(refusal(with_prop(R"({"type":"integer","minimum":5,"maximum":3})")) ==
          at + "the range minimum 5, maximum 3 admits no value");
    // The edges the grammar does write, and ranges it does not apply: enum / const win over
    // "type" (§6.4), and without a numeric type the range is not enforced.
    CHECK(creates(with_prop(R"({"type":"integer","minimum":999999999999999})")));
    CHECK(creates(with_prop(R"({"type":"integer","maximum":-999999999999999})")));
    CHECK(creates(with_prop(R"({"type":"integer","minimum":-1e400})")));
    CHECK(creates(with_prop(R"({"type":"number","minimum":1e-14,"maximum":1e-14})")));
    CHECK(creates(with_prop(R"({"type":"number","minimum":0.5,"exclusiveMaximum":999999999999999.5})")));
    CHECK(creates(with_prop(R"({"type":"integer","minimum":1e19,"enum":[1e19]})")));
    CHECK(creates(with_prop(R"({"type":"string","minimum":1e19})")));
}
