// Tool-call grammar (tool-calling.md §6.3-§6.5): accept / reject byte strings per schema
// keyword, token-mask invariants, post-decode checks, and greedy decoding of a random-weight
// fixture model through the masks (every payload must parse and validate).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api_util.h"
#include "chat/grammar.h"
#include "chat/json.h"
#include "core/error.h"
#include "fixtures.h"
#include "model/model.h"

using namespace needle::chat;

namespace {

std::shared_ptr<const needle::Model> load_internal(const std::string &name) {
    return needle::load_model(needle::FileBytes::open(fixtures::v2("models/" + name + ".cact").c_str(), true), {});
}

// Token byte strings of the tok8192 (needle2 layout) and tok1024 (tiny) tokenizers.
const TokenBytes &tokens(const std::string &model = "needle2") {
    static std::shared_ptr<const needle::Model> m8 = load_internal("needle2"), m1 = load_internal("tiny");
    static TokenBytes t8(*m8->tokenizer()), t1(*m1->tokenizer());
    return model == "tiny" ? t1 : t8;
}

struct Compiled {
    JsonValue tools;
    std::shared_ptr<const Grammar> g;
};

Compiled compile(const std::string &tools_json, GrammarOptions opt = {}) {
    Compiled c{parse_json(tools_json), nullptr};
    std::vector<const JsonValue *> ptrs;
    for (const auto &t : c.tools.items) ptrs.push_back(&t);
    c.g = Grammar::compile(ptrs, opt);
    return c;
}

// One tool "f" with the given parameters schema.
std::string tool(const std::string &params) { return R"([{"name":"f","parameters":)" + params + "}]"; }
std::string obj(const std::string &props, const std::string &required = "[]") {
    return R"({"type":"object","properties":)" + props + R"(,"required":)" + required + "}";
}
// A call of f with these arguments.
std::string call(const std::string &args) { return R"([{"name":"f","arguments":)" + args + "}]"; }

bool accepts(const Compiled &c, const std::string &payload) {
    GrammarMatcher m(c.g, tokens());
    return m.accept_bytes(payload) && m.complete();
}
// The value schema of one property "v", tested with arguments {"v":<value>}.
bool value_ok(const std::string &schema, const std::string &value) {
    return accepts(compile(tool(obj(R"({"v":)" + schema + "}"))), call(R"({"v":)" + value + "}"));
}

}  // namespace

TEST_CASE("chat grammar: calls, names and the refusal") {
    const auto one = compile(R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])");
    CHECK(accepts(one, "[]"));
    CHECK(accepts(one, R"([{"name":"get_weather","arguments":{"city":"Paris"}}])"));
    CHECK_FALSE(accepts(one, R"([{"name":"get_weathe","arguments":{"city":"Paris"}}])"));
    CHECK_FALSE(accepts(one, R"([{"name":"compose_email","arguments":{}}])"));
    CHECK_FALSE(accepts(one, "[ ]"));  // no insignificant whitespace
    CHECK_FALSE(accepts(one, R"([{"name": "get_weather","arguments":{"city":"Paris"}}])"));
    // One tool: exactly one call.
    CHECK_FALSE(accepts(one, R"([{"name":"get_weather","arguments":{"city":"a"}},{"name":"get_weather","arguments":{"city":"b"}}])"));
    const auto two = compile(R"([{"name":"a","parameters":{}},{"name":"b"},{"name":"a","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}])");
    CHECK(accepts(two, R"([{"name":"a","arguments":{}},{"name":"b","arguments":{"q":[1,{"r":null}]}}])"));
    CHECK(accepts(two, R"([{"name":"a","arguments":{"anything":"goes"}}])"));  // duplicate name: first wins
    CHECK_FALSE(accepts(two, R"([{"name":"a","arguments":{}}"])"));
    // Names are written as §3.3 writes them (escapes, ASCII only).
    const auto esc = compile(R"([{"name":"m\u00e9t\"o"}])");
    CHECK(accepts(esc, R"([{"name":"m\u00e9t\"o","arguments":{}}])"));
    CHECK_FALSE(accepts(esc, "[{\"name\":\"m\xC3\xA9t\\\"o\",\"arguments\":{}}]"));
    const auto none = compile("[]");
    CHECK(accepts(none, "[]"));
    CHECK_FALSE(accepts(none, "[{"));
}

TEST_CASE("chat grammar: properties, required, repeated keys") {
    const std::string props = R"({"a":{"type":"integer"},"b":{"type":"boolean"},"c":{"type":"null"}})";
    const auto c = compile(tool(obj(props, R"(["a","zz"])")));
    CHECK(accepts(c, call(R"({"a":1})")));
    CHECK(accepts(c, call(R"({"b":true,"a":-3,"c":null})")));  // any order, optional omitted
    CHECK_FALSE(accepts(c, call(R"({"b":true})")));             // required a missing
    CHECK_FALSE(accepts(c, call(R"({})")));
    CHECK_FALSE(accepts(c, call(R"({"a":1,"a":2})")));          // each key at most once
    CHECK_FALSE(accepts(c, call(R"({"a":1,"d":2})")));          // keys from properties only
    CHECK_FALSE(accepts(c, call(R"({"a":1,})")));
    CHECK_FALSE(accepts(c, call(R"({"a" :1})")));
    GrammarOptions loose;
    loose.require_required = false;
    CHECK(accepts(compile(tool(obj(props, R"(["a"])")), loose), call("{}")));
    // Once every key appeared, ',' is not offered.
    const auto one_key = compile(tool(obj(R"({"a":{"type":"integer"}})")));
    GrammarMatcher m(one_key.g, tokens());
    CHECK(m.accept_bytes(R"([{"name":"f","arguments":{"a":1)"));
    CHECK_FALSE(m.accept_bytes(","));
    CHECK(m.accept_bytes("}}]"));
    CHECK(m.complete());
    // Nested objects and properties without type.
    const auto nested = compile(tool(obj(R"({"o":{"type":"object","properties":{"x":{"enum":[1,2]}},"required":["x"]},"p":{"properties":{"y":{"type":"string"}}}})")));
    CHECK(accepts(nested, call(R"({"o":{"x":2},"p":{"y":"s"}})")));
    CHECK_FALSE(accepts(nested, call(R"({"o":{}})")));
    CHECK_FALSE(accepts(nested, call(R"({"o":{"x":3}})")));
    CHECK_FALSE(accepts(nested, call(R"({"p":5})")));
}

TEST_CASE("chat grammar: enum and const are closed sets in canonical form") {
    const std::string e = R"({"type":"string","enum":["celsius","fahrenheit","c\u00e9",1,10,1.50,null,true]})";
    for (const char *v : {"\"celsius\"", "\"fahrenheit\"", "\"c\\u00e9\"", "1", "10", "1.5", "null", "true"})
        CHECK_MESSAGE(value_ok(e, v), v);
    for (const char *v : {"\"celsiu\"", "\"Celsius\"", "\"c\xC3\xA9\"", "100", "1.50", "false", "\"1\""})
        CHECK_FALSE_MESSAGE(value_ok(e, v), v);
    CHECK(value_ok(R"({"const":"EUR"})", "\"EUR\""));
    CHECK_FALSE(value_ok(R"({"const":"EUR"})", "\"USD\""));
    CHECK(value_ok(R"({"const":{"a":[1,2]}})", R"({"a":[1,2]})"));
    // An empty enum cannot be written: the optional key disappears; a required one kills the tool.
    CHECK(accepts(compile(tool(obj(R"({"v":{"enum":[]}})"))), call("{}")));
    CHECK_FALSE(accepts(compile(tool(obj(R"({"v":{"enum":[]}})", R"(["v"])"))), call("{}")));
}

TEST_CASE("chat grammar: integer ranges pruned by prefix") {
    const std::string s = R"({"type":"integer","minimum":1,"maximum":86400})";
    for (const char *v : {"1", "9", "10", "86400", "3600"}) CHECK_MESSAGE(value_ok(s, v), v);
    for (const char *v : {"0", "-1", "86401", "100000", "01", "1.0", "1e3", "-0", "+5"})
        CHECK_FALSE_MESSAGE(value_ok(s, v), v);
    CHECK(value_ok(R"({"type":"integer","minimum":-1,"maximum":0})", "-1"));
    CHECK(value_ok(R"({"type":"integer","minimum":-1,"maximum":0})", "-0"));
    CHECK(value_ok(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":5})", "4"));
    CHECK_FALSE(value_ok(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":5})", "5"));
    CHECK_FALSE(value_ok(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":5})", "0"));
    CHECK(value_ok(R"({"type":"integer","minimum":2.5})", "3"));
    CHECK(value_ok(R"({"type":"integer"})", "-123456789012345678901234567890"));
    // Pruning: after {"v": the digit 0 cannot start a value in [5, 9]; '-' cannot either.
    const auto c = compile(tool(obj(R"({"v":{"type":"integer","minimum":5,"maximum":9}})")));
    GrammarMatcher m(c.g, tokens());
    REQUIRE(m.accept_bytes(R"([{"name":"f","arguments":{"v":)"));
    CHECK_FALSE(m.accept_bytes("0"));
    CHECK_FALSE(m.accept_bytes("-"));
    CHECK_FALSE(m.accept_bytes("1"));
    CHECK(m.accept_bytes("7"));
    CHECK_FALSE(m.accept_bytes("0"));
    // Unsatisfiable range: the required key makes the tool unreachable.
    CHECK_FALSE(accepts(compile(tool(obj(R"({"v":{"type":"integer","minimum":3,"maximum":2}})", R"(["v"])"))),
                        call(R"({"v":3})")));
}

TEST_CASE("chat grammar: a range beyond the digits of a bounded number is unsatisfiable, not a dead end") {
    // At most kBoundedDigits digits, no exponent: minimum 1e19 leaves no value. The type is
    // dropped (as for an empty range) instead of leaving a frame no byte continues.
    CHECK(gram::kBoundedDigits == 15);
    CHECK_FALSE(gram::range_writable(true, 1e19, true, HUGE_VAL, true));
    CHECK_FALSE(gram::range_writable(true, HUGE_VAL, true, HUGE_VAL, true));  // 1e400
    CHECK_FALSE(gram::range_writable(true, 999999999999999.0, false, HUGE_VAL, true));
    CHECK(gram::range_writable(true, 999999999999999.0, true, HUGE_VAL, true));
    CHECK_FALSE(gram::range_writable(false, 1e-20, true, 1e-16, true));
    CHECK(gram::range_writable(false, 0.1, true, 0.1, true));
    CHECK(gram::range_writable(false, -0.5, true, -0.25, true));
    const std::string big = R"({"type":["integer","null"],"minimum":1e19})";
    CHECK(value_ok(big, "null"));
    CHECK_FALSE(value_ok(big, "1"));
    // A required key of that type: only the refusal remains, and its masks are never empty.
    const auto c = compile(tool(obj(R"({"v":{"type":"integer","minimum":1e19}})", R"(["v"])")));
    CHECK(accepts(c, "[]"));
    CHECK_FALSE(accepts(c, call(R"({"v":10000000000000000000})")));
    GrammarMatcher m(c.g, tokens());
    std::vector<uint64_t> mask((tokens().size() + 63) / 64);
    REQUIRE(m.accept_bytes("["));
    CHECK(m.fill_mask(mask.data()) > 0);
    CHECK_FALSE(m.accept_bytes("{"));
    // The edge the matcher writes: the largest 15-digit integer.
    CHECK(value_ok(R"({"type":"integer","minimum":999999999999999})", "999999999999999"));
}

TEST_CASE("chat grammar: a bounded number prefix is offered only while its digits can reach the range") {
    // A prefix whose cell meets the range only between the values its remaining digits can
    // write was offered (dense test), then no byte continued it: fill_mask 0 (found by
    // fuzz_grammar in CI). 14 integer digits leave one fraction digit: .9 < .95 < 1, and a
    // 15th integer digit overshoots; so after 13 digits "4" is a dead end and "5" is not.
    const auto c = compile(tool(obj(R"({"v":{"type":"number","exclusiveMinimum":12345678901234.95,"maximum":12345678901300}})", R"(["v"])")));
    GrammarMatcher m(c.g, tokens());
    REQUIRE(m.accept_bytes(R"([{"name":"f","arguments":{"v":1234567890123)"));
    CHECK_FALSE(m.accept_bytes("4"));
    CHECK(m.accept_bytes("5"));
    CHECK_FALSE(m.accept_bytes("0"));  // 123456789012350 > 12345678901300
    CHECK(m.accept_bytes(".5}}]"));
    CHECK(m.complete());
    // "0." and 12 zeros leave two digits: "0" then one worth 1e-14 stays below 9.5e-13.
    const std::string tiny = R"({"type":"number","exclusiveMinimum":0.00000000000095,"maximum":1})";
    CHECK(value_ok(tiny, "0.000000000001"));
    CHECK_FALSE(value_ok(tiny, "0.00000000000001"));
    const auto t = compile(tool(obj(R"({"v":)" + tiny + "}", R"(["v"])")));
    GrammarMatcher mt(t.g, tokens());
    REQUIRE(mt.accept_bytes(R"([{"name":"f","arguments":{"v":0.000000000000)"));
    CHECK_FALSE(mt.accept_bytes("0"));
    CHECK(mt.accept_bytes("96}}]"));
    CHECK(mt.complete());
    // Random walks through the masks over ranges at the digit limit and around zero: every mask
    // on the way is non-empty and every walk completes with a value in range.
    const char *ranges[] = {
        R"("exclusiveMinimum":12345678901234.95,"maximum":12345678901300)",
        R"("exclusiveMinimum":0.00000000000095,"maximum":1)",
        R"("minimum":-0.00000000000095,"exclusiveMaximum":-0.0000000000009)",
        R"("minimum":-999999999999999,"maximum":-99999999999999.5)",
        R"("exclusiveMinimum":-1,"exclusiveMaximum":0)",
        R"("minimum":0.123456789012345,"maximum":0.12345678901235)",
        R"("minimum":99999999999999.95,"maximum":100000000000000.5)",
    };
    std::mt19937 rng(7);
    std::vector<uint64_t> mask((tokens().size() + 63) / 64);
    for (const char *r : ranges) {
        for (const char *type : {"number", "integer"}) {
            const std::string schema = std::string(R"({"type":")") + type + "\"," + r + "}";
            const auto g = compile(tool(obj(R"({"v":)" + schema + "}", R"(["v"])")), GrammarOptions{true, true});
            for (int walk = 0; walk < 40; ++walk) {
                GrammarMatcher w(g.g, tokens());
                std::string out;
                int steps = 0;
                for (; steps < 300 && !w.complete(); ++steps) {
                    const size_t n = w.fill_mask(mask.data());
                    if (n == 0) break;
                    std::vector<uint32_t> ids;
                    for (uint32_t id = 0; id < tokens().size(); ++id)
                        if ((mask[id / 64] >> (id % 64)) & 1) ids.push_back(id);
                    const uint32_t pick = ids[rng() % ids.size()];
                    REQUIRE(w.accept(pick));
                    out += tokens().bytes(pick);
                }
                INFO(schema << " -> " << out);
                CHECK(w.complete());
                if (w.complete() && out != "[]") CHECK(value_ok(schema, out.substr(out.find("\"v\":") + 4, out.size() - out.find("\"v\":") - 7)));
            }
        }
    }
}

TEST_CASE("chat grammar: number ranges, forms and exponents") {
    const std::string s = R"({"type":"number","exclusiveMinimum":0,"maximum":10000.0})";
    for (const char *v : {"0.5", "10000", "10000.0", "0.01", "9999.99", "1"}) CHECK_MESSAGE(value_ok(s, v), v);
    for (const char *v : {"0", "0.0", "-1", "10000.5", "10001", "1e3", "1.", ".5", "00.5"})
        CHECK_FALSE_MESSAGE(value_ok(s, v), v);
    for (const char *v : {"1e-05", "-2.5E+10", "0", "-0.0", "123.456e7"}) CHECK_MESSAGE(value_ok(R"({"type":"number"})", v), v);
    CHECK_FALSE(value_ok(R"({"type":"number"})", "1e"));
    CHECK_FALSE(value_ok(R"({"type":"number"})", "NaN"));
    CHECK(value_ok(R"({"type":"number","minimum":-0.5,"maximum":-0.25})", "-0.3"));
    CHECK_FALSE(value_ok(R"({"type":"number","minimum":-0.5,"maximum":-0.25})", "-0.2"));
}

TEST_CASE("chat grammar: strings, lengths in code points, escapes, UTF-8") {
    const std::string s = R"({"type":"string","minLength":2,"maxLength":3})";
    CHECK(value_ok(s, "\"ab\""));
    CHECK(value_ok(s, "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\""));  // 3 code points, 9 bytes
    CHECK(value_ok(s, R"("\u00e9\n")"));
    CHECK(value_ok(s, R"("\ud83d\ude00x")"));  // a surrogate pair is one code point
    CHECK_FALSE(value_ok(s, "\"a\""));
    CHECK_FALSE(value_ok(s, "\"abcd\""));
    CHECK_FALSE(value_ok(s, "\"\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\""));
    const std::string f = R"({"type":"string"})";
    CHECK(value_ok(f, R"("a\"b\\c\/d\b\f\n\r\t")"));
    CHECK(value_ok(f, "\"\""));
    CHECK_FALSE(value_ok(f, "\"a\tb\""));         // raw control character
    CHECK_FALSE(value_ok(f, R"("\x")"));
    CHECK_FALSE(value_ok(f, R"("\ud800")"));      // lone high surrogate
    CHECK_FALSE(value_ok(f, R"("\udc00")"));      // lone low surrogate
    CHECK_FALSE(value_ok(f, R"("\ud800\u0041")"));
    CHECK_FALSE(value_ok(f, "\"\xC3\""));         // truncated UTF-8
    CHECK_FALSE(value_ok(f, "\"\xED\xA0\x80\""));  // UTF-8 surrogate
    CHECK_FALSE(value_ok(f, "\"\xC0\xAF\""));      // overlong
    CHECK_FALSE(value_ok(f, "\"\xFF\""));
    CHECK_FALSE(value_ok(f, "5"));
}

TEST_CASE("chat grammar: booleans, null, type unions, arrays, any value") {
    CHECK(value_ok(R"({"type":"boolean"})", "false"));
    CHECK_FALSE(value_ok(R"({"type":"boolean"})", "1"));
    CHECK(value_ok(R"({"type":"null"})", "null"));
    const std::string u = R"({"type":["string","null"],"maxLength":2})";
    CHECK(value_ok(u, "null"));
    CHECK(value_ok(u, "\"ab\""));
    CHECK_FALSE(value_ok(u, "\"abc\""));
    CHECK_FALSE(value_ok(u, "3"));
    CHECK(value_ok(R"({"type":["integer","number"]})", "2.5"));  // number covers integer
    const std::string a = R"({"type":"array","items":{"enum":["x","y"]},"minItems":1,"maxItems":2})";
    CHECK(value_ok(a, R"(["x"])"));
    CHECK(value_ok(a, R"(["y","x"])"));
    CHECK_FALSE(value_ok(a, "[]"));
    CHECK_FALSE(value_ok(a, R"(["x","y","x"])"));
    CHECK_FALSE(value_ok(a, R"(["z"])"));
    CHECK_FALSE(value_ok(a, R"(["x",])"));
    CHECK(value_ok(R"({"type":"array"})", R"([1,"a",[{}],{"k":[null]}])"));
    for (const char *any : {R"({"anyOf":[{"type":"string"},{"type":"null"}]})", R"({"$ref":"#/$defs/X"})", "{}",
                            R"({"description":"free"})", R"({"oneOf":[]})"}) {
        CHECK_MESSAGE(value_ok(any, R"({"a":[1,-2.5e3,"s",true,false,null,{}]})"), any);
        CHECK_MESSAGE(value_ok(any, "\"x\""), any);
        CHECK_FALSE_MESSAGE(value_ok(any, "{\"a\" : 1}"), any);
        CHECK_FALSE_MESSAGE(value_ok(any, "nul"), any);
    }
}

TEST_CASE("chat grammar: compile limits give specific errors") {
    std::string deep = R"({"type":"string"})";
    for (int k = 0; k < 26; ++k) deep = obj(R"({"x":)" + deep + "}");
    try {
        compile(tool(deep));
        FAIL("no error");
    } catch (const needle::Error &e) {
        CHECK(e.code() == NEEDLE_E_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("nested deeper than 24") != std::string::npos);
    }
    std::string many = "{";
    for (int k = 0; k < 65; ++k) many += (k ? ",\"p" : "\"p") + std::to_string(k) + "\":{}";
    many += "}";
    CHECK_THROWS_WITH_AS(compile(tool(obj(many))), doctest::Contains("65 properties"), needle::Error);
}

TEST_CASE("chat grammar: token masks match accept, are never empty, and end at </tool_call>") {
    const TokenBytes &tb = tokens();
    REQUIRE(tb.end_call_id() == 11);
    CHECK(tb.bytes(24) == "\n");
    CHECK(tb.is_marker(6));
    CHECK(tb.bytes(6).empty() == false);  // USER_DEFINED keeps its surface; still a marker
    const auto c = compile(R"([{"name":"set_timer","parameters":{"type":"object","properties":{"seconds":{"type":"integer","minimum":1,"maximum":86400},"label":{"type":"string","maxLength":12},"unit":{"enum":["s","min"]}},"required":["seconds"]}},{"name":"noop"}])");
    const std::string payload = R"([{"name":"set_timer","arguments":{"label":"Tea \u00e9 time","seconds":300,"unit":"min"}},{"name":"noop","arguments":{}}])";
    std::vector<uint64_t> mask(tb.words());
    GrammarMatcher m(c.g, tb);
    // Walk the payload byte by byte with byte tokens, checking the mask against accept().
    std::mt19937 rng(7);
    for (size_t i = 0; i < payload.size(); ++i) {
        const size_t n = m.fill_mask(mask.data());
        REQUIRE(n > 0);
        size_t set = 0;
        for (uint64_t w : mask) set += size_t(__builtin_popcountll(w));
        CHECK(set == n);
        // Spaces between JSON tokens are masked (compact form), markers always.
        if (std::count(payload.begin(), payload.begin() + long(i), '"') % 2 == 0) {  // outside strings
            const uint32_t space = 14 + ' ';
            CHECK(((mask[space / 64] >> (space % 64)) & 1) == 0);
        }
        CHECK(((mask[0] >> 11) & 1) == 0);
        for (int probe = 0; probe < 40; ++probe) {
            const uint32_t id = rng() % tb.size();
            const bool allowed = (mask[id / 64] >> (id % 64)) & 1;
            GrammarMatcher copy(c.g, tb);
            REQUIRE(copy.accept_bytes(payload.substr(0, i)));
            CHECK_MESSAGE(copy.accept(id) == allowed, "token " << id << " at byte " << i);
        }
        const uint32_t byte_tok = 14 + uint8_t(payload[i]);
        REQUIRE(((mask[byte_tok / 64] >> (byte_tok % 64)) & 1) == 1);
        REQUIRE(m.accept(byte_tok));
    }
    CHECK(m.complete());
    CHECK(m.fill_mask(mask.data()) == 1);
    CHECK(((mask[0] >> 11) & 1) == 1);
    CHECK(m.accept(11));
    CHECK_FALSE(m.accept(14 + ']'));
    m.reset();
    CHECK_FALSE(m.complete());
    CHECK_FALSE(m.accept(11));
    CHECK(m.accept(14 + '['));
}

TEST_CASE("chat grammar: post-decode checks (pattern, format, multipleOf, uniqueItems)") {
    const auto c = compile(tool(obj(R"({"code":{"type":"string","pattern":"^(?=E)[A-Z]{3}$"},"day":{"type":"string","format":"date"},"mail":{"type":"string","format":"email"},"amount":{"type":"number","multipleOf":0.01},"n":{"type":"integer","multipleOf":5},"tags":{"type":"array","uniqueItems":true}})")));
    const auto check = [&](const std::string &args) { return post_check(*c.g, parse_json(call(args))); };
    CHECK(check(R"({"code":"EUR","day":"2026-12-01","mail":"a@b.io","amount":12.34,"n":15,"tags":["a","b"]})") == "");
    CHECK(check(R"({"code":"eur"})").find("pattern") != std::string::npos);  // lookahead: checked after decoding
    CHECK(check(R"({"code":"USD"})").find("pattern") != std::string::npos);
    CHECK(check(R"({"day":"2026-13-01"})").find("date") != std::string::npos);
    CHECK(check(R"({"mail":"nobody"})").find("email") != std::string::npos);
    CHECK(check(R"({"amount":12.345})").find("multiple of 0.01") != std::string::npos);
    CHECK(check(R"({"n":7})").find("multiple of 5") != std::string::npos);
    CHECK(check(R"({"amount":0})") == "");
    CHECK(check(R"({"amount":1e-12})").find("multiple of 0.01") != std::string::npos);  // passed: within 1e-9 of 0
    CHECK(check(R"({"amount":0.30000000000000004})") == "");  // rounding, not a remainder
    const auto huge = compile(tool(obj(R"({"n":{"type":"integer","multipleOf":1e300}})")));
    CHECK(post_check(*huge.g, parse_json(call(R"({"n":8000001100800000000})"))).find("multiple of 1e+300") != std::string::npos);
    CHECK(post_check(*huge.g, parse_json(call(R"({"n":0})"))) == "");
    CHECK(check(R"({"tags":[1,"1",1]})").find("unique") != std::string::npos);
    CHECK(check(R"({"tags":[1,"1"]})") == "");
    CHECK(post_check(*c.g, parse_json(R"([{"name":"g","arguments":{}}])")).find("undeclared") != std::string::npos);
}

TEST_CASE("chat grammar: pattern repeat counts up to the limit are in the grammar, above it refused by count") {
    // kMaxPatternRepeat is a count the automaton holds: ^a{500}$ is enforced byte by byte.
    const std::string s = R"({"type":"string","pattern":"^a{)" + std::to_string(kMaxPatternRepeat) + R"(}$"})";
    const std::string n = std::string(kMaxPatternRepeat, 'a');
    CHECK(value_ok(s, "\"" + n + "\""));
    CHECK_FALSE(value_ok(s, "\"" + n.substr(1) + "\""));
    CHECK_FALSE(value_ok(s, "\"" + n + "a\""));
    PatternDfa d;
    std::string why = "stale";
    REQUIRE(compile_pattern("^a{500}$", d, &why));
    CHECK(why.empty());
    // Above it: refused with the count as written, however many digits (no 32- or 64-bit wrap).
    for (const char *p : {"^a{501}$", "a{4294967296}", "a{0,99999999999999999999999}", "(?=x)a{1000000}"}) {
        CHECK_FALSE_MESSAGE(compile_pattern(p, d, &why), p);
        CHECK_MESSAGE(why.find("exceeds the limit of 500") != std::string::npos, p);
    }
    CHECK(why == "repeat count 1000000 exceeds the limit of 500");
    // Merely outside the subset: no refusal (std::regex checks it after decoding, §6.4).
    CHECK_FALSE(compile_pattern("(?=x)a{3}", d, &why));
    CHECK(why.empty());
}

TEST_CASE("chat grammar: pattern as an automaton over code points") {
    const std::string cur = R"({"type":"string","pattern":"^[A-Z]{3}$"})";
    CHECK(value_ok(cur, "\"EUR\""));
    CHECK_FALSE(value_ok(cur, "\"eur\""));
    CHECK_FALSE(value_ok(cur, "\"EU\""));
    CHECK_FALSE(value_ok(cur, "\"EURO\""));
    CHECK(value_ok(cur, R"("\u0045UR")"));  // escapes are decoded before the automaton
    // Unanchored patterns search: anything around the match.
    const std::string zip = R"({"type":"string","pattern":"\\d{5}"})";
    CHECK(value_ok(zip, "\"zip 75001, Paris\""));
    CHECK_FALSE(value_ok(zip, "\"7500\""));
    const std::string alt = R"({"type":"string","pattern":"^(?:foo|ba[rz]+)(-\\w)?$"})";
    for (const char *v : {"\"foo\"", "\"barzz\"", "\"foo-x\"", "\"baz-_\""}) CHECK_MESSAGE(value_ok(alt, v), v);
    for (const char *v : {"\"fo\"", "\"ba\"", "\"foo-\"", "\"foo-xx\"", "\"Foo\""}) CHECK_FALSE_MESSAGE(value_ok(alt, v), v);
    // '.' is one code point, not one byte; classes hold non-ASCII ranges.
    const std::string dots = R"({"type":"string","pattern":"^.{2}$"})";
    CHECK(value_ok(dots, "\"\xC3\xA9\xF0\x9F\x98\x80\""));
    CHECK_FALSE(value_ok(dots, "\"\xC3\xA9\""));
    CHECK_FALSE(value_ok(dots, "\"a\\n\""));  // '.' excludes line terminators
    const std::string greek = R"({"type":"string","pattern":"^[\u03b1-\u03c9]+$"})";
    CHECK(value_ok(greek, "\"\xCE\xB1\xCE\xB2\""));
    CHECK(value_ok(greek, R"("\u03b1")"));
    CHECK_FALSE(value_ok(greek, "\"a\""));
    // Pattern and maxLength together: only values that fit both.
    const std::string both = R"({"type":"string","pattern":"^a+b$","maxLength":3})";
    CHECK(value_ok(both, "\"aab\""));
    CHECK_FALSE(value_ok(both, "\"aaab\""));
    // The mask never leads into a dead end: after "aa", only 'a'... 'b' survive, and the
    // 3rd code point must be 'b'.
    const auto c = compile(tool(obj(R"({"v":)" + both + "}")));
    GrammarMatcher m(c.g, tokens());
    REQUIRE(m.accept_bytes(R"([{"name":"f","arguments":{"v":"aa)"));
    CHECK_FALSE(m.accept_bytes("a"));
    CHECK_FALSE(m.accept_bytes("\""));
    CHECK_FALSE(m.accept_bytes("\xC3"));  // no 2-byte code point can continue
    CHECK(m.accept_bytes("b\"}}]"));
    // A pattern no string matches within maxLength makes a required key's tool unreachable.
    CHECK_FALSE(accepts(compile(tool(obj(R"({"v":{"type":"string","pattern":"^abcd$","maxLength":3}})", R"(["v"])"))),
                        call(R"({"v":"abc"})")));
    // A literal only a lone surrogate matches (the JSON parser keeps "\udc00" in the pattern):
    // no string can carry one, so that branch is dead and the mask never offers the prefix
    // before it (it did: after "a" nothing continued, found by fuzz_grammar).
    const std::string lone = R"({"type":"string","pattern":"^a(?:b\udc00|c)$"})";
    CHECK(value_ok(lone, "\"ac\""));
    const auto cl = compile(tool(obj(R"({"v":)" + lone + "}", R"(["v"])")));
    GrammarMatcher ml(cl.g, tokens());
    REQUIRE(ml.accept_bytes(R"([{"name":"f","arguments":{"v":"a)"));
    CHECK_FALSE(ml.accept_bytes("b"));
    std::vector<uint64_t> mask((tokens().size() + 63) / 64);
    CHECK(ml.fill_mask(mask.data()) > 0);
    CHECK_FALSE(accepts(compile(tool(obj(R"({"v":{"type":"string","pattern":"^a\udc00$"}})", R"(["v"])"))),
                        call("{\"v\":\"a\\udc00\"}")));
    // Outside the subset: free in the grammar, checked after decoding.
    CHECK(value_ok(R"({"type":"string","pattern":"^(a)\\1$"})", "\"xy\""));
    PatternDfa d;
    for (const char *p : {"(a)\\1", "(?=a)", "a\\b", "^a|b$", "a^b", "\\p{L}", "[a", "a{2,1}b"}) CHECK_FALSE_MESSAGE(compile_pattern(p, d), std::string(p));
    for (const char *p : {"", "^$", "a{2,}", "[^\\d\\s]", "x{3", "[]a]", "\\u00e9|\\x41", "(?:a|)*b"}) CHECK_MESSAGE(compile_pattern(p, d), std::string(p));
}
