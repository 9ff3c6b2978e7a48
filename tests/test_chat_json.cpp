// JSON parser + canonical writer (tool-calling.md §3.3): every tool-calling fixture case's
// engine_tools_json canonicalises to tools_rendered byte for byte, plus one test per rule.
#include <doctest/doctest.h>

#include <string>

#include "chat/json.h"
#include "core/error.h"
#include "fixtures.h"

using needle::chat::JsonLimits;
using needle::chat::JsonValue;
using needle::chat::parse_json;
using needle::chat::write_canonical;

namespace {

std::string canon(std::string_view in, const JsonLimits &lim = {}) {
    std::string out;
    write_canonical(parse_json(in, lim), out);
    return out;
}

// The error message of parse_json(in), "" if it parsed.
std::string parse_error(std::string_view in, const JsonLimits &lim = {}) {
    try {
        parse_json(in, lim);
    } catch (const needle::Error &e) {
        CHECK(e.code() == NEEDLE_E_INVALID_ARGUMENT);
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("chat json: fixture cases canonicalise to tools_rendered") {
    const auto index = fixtures::read_json(fixtures::dir() + "/tool-calling/index.json");
    size_t n = 0;
    for (const auto &c : index.at("cases")) {
        const auto cs = fixtures::read_json(fixtures::dir() + "/tool-calling/" + c.at("file").get<std::string>());
        INFO(cs.at("id").get<std::string>());
        CHECK(canon(cs.at("engine_tools_json").get<std::string>()) == cs.at("tools_rendered").get<std::string>());
        // The canonical form is a fixed point.
        CHECK(canon(cs.at("tools_rendered").get<std::string>()) == cs.at("tools_rendered").get<std::string>());
        ++n;
    }
    CHECK(n == 16);
}

TEST_CASE("chat json: numbers take Python int / float repr forms") {
    CHECK(canon("1E2") == "100.0");
    CHECK(canon("1.50") == "1.5");
    CHECK(canon("0.00001") == "1e-05");
    CHECK(canon("1e-5") == "1e-05");
    CHECK(canon("0.0001") == "0.0001");
    CHECK(canon("1e16") == "1e+16");
    CHECK(canon("1e15") == "1000000000000000.0");
    CHECK(canon("123456789012345678e0") == "1.2345678901234568e+17");
    CHECK(canon("-0") == "0");
    CHECK(canon("-0.0") == "-0.0");
    CHECK(canon("-0e5") == "-0.0");
    CHECK(canon("0.1") == "0.1");
    CHECK(canon("2.5e-7") == "2.5e-07");
    CHECK(canon("1.7976931348623157e308") == "1.7976931348623157e+308");
    CHECK(canon("1e400") == "Infinity");
    CHECK(canon("-1e400") == "-Infinity");
    CHECK(canon("1e-400") == "0.0");
    CHECK(canon("-1e-400") == "-0.0");
    CHECK(canon("0.000000000000000000000000000000001e400") == "Infinity");
    CHECK(canon("[NaN,Infinity,-Infinity]") == "[NaN,Infinity,-Infinity]");
    CHECK(canon("123456789012345678901234567890") == "123456789012345678901234567890");
    CHECK(canon("-98765432109876543210") == "-98765432109876543210");
    const JsonValue v = parse_json("[10000.0,7,1e-05]");
    CHECK(v.items[0].kind == JsonValue::Kind::Float);
    CHECK(v.items[0].number == 10000.0);
    CHECK(v.items[1].kind == JsonValue::Kind::Int);
    CHECK(v.items[1].text == "7");
    CHECK(v.items[2].text == "1e-05");
    for (const char *bad : {"01", "1.", ".5", "-", "+1", "1e", "--1", "0x10", "nan", "infinity", "1.e5"})
        CHECK_MESSAGE(parse_error(bad) != "", bad);
}

TEST_CASE("chat json: string escapes, surrogates and UTF-8") {
    CHECK(canon(R"("a\"b\\c/\/")") == R"("a\"b\\c//")");
    CHECK(canon("\"\\n\\r\\t\\b\\f\"") == "\"\\n\\r\\t\\b\\f\"");
    CHECK(canon(R"("\u0001\u001f\u007f ~")") == R"("\u0001\u001f\u007f ~")");
    CHECK(canon("\"M\xC3\xA9t\xC3\xA9o\"") == R"("M\u00e9t\u00e9o")");
    CHECK(canon(R"("M\u00E9t\u00e9o")") == R"("M\u00e9t\u00e9o")");
    CHECK(canon("\"\xF0\x9F\x98\x80\"") == R"("\ud83d\ude00")");
    CHECK(canon(R"("\uD83D\uDE00")") == R"("\ud83d\ude00")");
    CHECK(parse_json(R"("\ud83d\ude00")").text == "\xF0\x9F\x98\x80");
    // Lone surrogates are written back unchanged (lowercase hex).
    CHECK(canon(R"("\ud800")") == R"("\ud800")");
    CHECK(canon(R"("x\uDC00y")") == R"("x\udc00y")");
    CHECK(canon(R"("\ud800\u0041")") == R"("\ud800A")");
    CHECK(canon(R"("\ude00\ud83d")") == R"("\ude00\ud83d")");
    CHECK(canon(R"(["\ud83d","\ude00"])") == R"(["\ud83d","\ude00"])");
    CHECK(parse_error("\"\x01\"").find("control character") != std::string::npos);
    CHECK(parse_error("\"\xC3\"").find("invalid UTF-8") != std::string::npos);
    CHECK(parse_error("\"\xED\xA0\x80\"").find("invalid UTF-8") != std::string::npos);  // raw surrogate
    CHECK(parse_error("\"\xC0\xAF\"").find("invalid UTF-8") != std::string::npos);      // overlong
    CHECK(parse_error("\"\xF4\x90\x80\x80\"").find("invalid UTF-8") != std::string::npos);
    CHECK(parse_error(R"("\x")").find("invalid escape") != std::string::npos);
    CHECK(parse_error(R"("\u12G4")").find("\\u escape") != std::string::npos);
    CHECK(parse_error(R"("\u12)").find("\\u escape") != std::string::npos);
    CHECK(parse_error("\"abc").find("unterminated") != std::string::npos);
}

TEST_CASE("chat json: objects keep first position, last value, literals, whitespace") {
    CHECK(canon(R"({"a":1,"b":2,"a":3})") == R"({"a":3,"b":2})");
    CHECK(canon(R"({ "z" : [ true , false , null ] , "y" : { } , "x" : [ ] })") ==
          R"({"z":[true,false,null],"y":{},"x":[]})");
    // Many keys: the hashed index behaves like the linear search.
    std::string big = "{", want = "{";
    for (int k = 0; k < 100; ++k) big += "\"k" + std::to_string(k) + "\":" + std::to_string(k) + ",";
    for (int k = 0; k < 100; k += 7) big += "\"k" + std::to_string(k) + "\":\"r\",";
    big += "\"k0\":null}";
    for (int k = 0; k < 100; ++k)
        want += (k ? ",\"k" : "\"k") + std::to_string(k) + "\":" + (k == 0 ? "null" : k % 7 ? std::to_string(k) : "\"r\"");
    want += "}";
    CHECK(canon(big) == want);
    const JsonValue o = parse_json(R"({"name":"f","x":{"y":1}})");
    REQUIRE(o.find("x") != nullptr);
    CHECK(o.find("x")->find("y")->text == "1");
    CHECK(o.find("nope") == nullptr);
    CHECK(canon(" \t\r\n[1]\n") == "[1]");
    CHECK(parse_error("") != "");
    CHECK(parse_error("[1] x").find("extra data") != std::string::npos);
    CHECK(parse_error("[1,]") != "");
    CHECK(parse_error("{\"a\" 1}").find("':'") != std::string::npos);
    CHECK(parse_error("{1:2}").find("key") != std::string::npos);
    CHECK(parse_error("[1 2]").find("','") != std::string::npos);
    CHECK(parse_error("tru") != "");
    CHECK(parse_error("\xEF\xBB\xBF[]") != "");  // a BOM is not JSON (Python refuses it too)
}

TEST_CASE("chat json: depth, size and value-count limits") {
    std::string deep(10000, '[');
    deep += std::string(10000, ']');
    CHECK(parse_error(deep).find("nested deeper than 64 levels") != std::string::npos);
    std::string deep_obj;
    for (int k = 0; k < 10000; ++k) deep_obj += "{\"properties\":";
    CHECK(parse_error(deep_obj).find("nested deeper than 64") != std::string::npos);
    std::string ok64(64, '['), ok65(65, '[');
    ok64 += std::string(64, ']');
    ok65 += std::string(65, ']');
    CHECK(parse_error(ok64) == "");
    CHECK(parse_error(ok65) != "");
    JsonLimits small;
    small.max_bytes = 100;
    CHECK(parse_error(std::string(101, ' '), small).find("over the 100-byte limit") != std::string::npos);
    // A 10 MB tools list parses within the defaults; past max_values it is refused.
    std::string list = "[";
    const std::string tool = R"({"name":"t","description":")" + std::string(1000, 'd') + R"(","parameters":{}},)";
    while (list.size() < (size_t(10) << 20)) list += tool;
    list.back() = ']';
    const JsonValue v = parse_json(list);
    CHECK(v.items.size() == (list.size() - 1) / tool.size());
    JsonLimits few;
    few.max_values = 1000;
    CHECK(parse_error(list, few).find("more than 1000 values") != std::string::npos);
}
