// The tool-calling chat (issue 9; shared/spec/tool-calling.md) through the C API: the 16 public
// prompt fixtures (shared/fixtures/tool-calling), completion parsing, the envelope and its
// buffer rules, bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "api_util.h"
#include "chat_util.h"
#include "chat/completion.h"
#include "chat/template.h"
#include "chat/json.h"
#include "fixtures.h"
#include "model/model.h"
#include "needle.h"

namespace {

using api_test::Model;

using chat_test::Chat;
using chat_test::complete_text;

std::string tc(const std::string &rel) { return fixtures::dir() + "/tool-calling/" + rel; }

Model &needle2() {  // the synthetic needle2 container carries the fixtures' tok8192 tokenizer
    static Model m = api_test::load(api_test::model_path("needle2"));
    return m;
}
Model &tiny() {
    static Model m = api_test::load(api_test::model_path("tiny"));
    return m;
}

needle_chat_params params(int32_t tool_choice = NEEDLE_TOOL_CHOICE_AUTO) {
    needle_chat_params p;
    p.struct_size = sizeof p;
    needle_chat_params_init(&p);
    p.tool_choice = tool_choice;
    return p;
}

Chat make_chat(needle_model *m, const std::string &system, const std::string &tools,
               const needle_chat_params &p = params()) {
    needle_chat *c = nullptr;
    const needle_status st = needle_chat_create(m, system.c_str(), tools.c_str(), &p, &c);
    INFO("needle_chat_create: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(c != nullptr);
    return Chat(c);
}

// Reads a text through the two-call buffer protocol of needle_chat_render / _tools_json.
template <class F>
std::string read_text(F &&call) {
    size_t len = 0;
    REQUIRE(call(nullptr, 0, &len) == NEEDLE_E_BUFFER_TOO_SMALL);
    std::string s(len + 1, 'x');
    size_t len2 = 0;
    REQUIRE(call(&s[0], s.size(), &len2) == NEEDLE_OK);
    REQUIRE(len2 == len);
    REQUIRE(s[len] == '\0');
    s.resize(len);
    return s;
}

std::string render(needle_chat *c, const std::string &text) {
    return read_text([&](char *o, size_t cap, size_t *len) { return needle_chat_render(c, text.c_str(), o, cap, len); });
}

std::string tools_json(needle_chat *c) {
    return read_text([&](char *o, size_t cap, size_t *len) { return needle_chat_tools_json(c, o, cap, len); });
}

nlohmann::json complete(needle_chat *c, const std::string &text, uint32_t max_new_tokens) {
    std::vector<char> buf(65536, 'x');
    size_t len = 0;
    const needle_status st = needle_chat_complete(c, text.c_str(), max_new_tokens, buf.data(), buf.size(), &len);
    INFO("needle_chat_complete: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(buf[len] == '\0');
    const std::string s(buf.data(), len);
    INFO("envelope: " << s);
    return nlohmann::json::parse(s);  // ordered_json not needed: key order is checked on the text
}

const std::vector<std::string> kEnvelopeKeys{"type",     "success",          "error",     "error_code",
                                             "reason",   "function_calls",   "suppressed_calls",
                                             "reasoning", "confidence",      "prefill_tps",
                                             "decode_tps", "peak_ram_mb"};

void check_key_order(const nlohmann::ordered_json &env) {
    std::vector<std::string> keys;
    for (auto it = env.begin(); it != env.end(); ++it) keys.push_back(it.key());
    CHECK(keys == kEnvelopeKeys);
}

}  // namespace

TEST_CASE("chat: fixture prompts render, tokenise and canonicalise like upstream") {
    const auto index = fixtures::read_json(tc("index.json"));
    REQUIRE(index["cases"].size() == 16);
    for (const auto &entry : index["cases"]) {
        const auto cs = fixtures::read_json(tc(entry["file"].get<std::string>()));
        const std::string id = cs["id"];
        INFO("case " << id);
        Chat c = make_chat(needle2().get(), cs["system"], cs["engine_tools_json"]);
        CHECK(tools_json(c.get()) == cs["tools_rendered"].get<std::string>());  // every declared tool
        const bool retrieval = cs.contains("retrieval_convention");
        uint32_t n_prefix = 0;
        if (!retrieval) {
            REQUIRE(needle_chat_static_prefix_tokens(c.get(), &n_prefix) == NEEDLE_OK);
            CHECK(n_prefix == cs["static_prefix_tokens"].get<uint32_t>());
        }
        const std::string prompt = render(c.get(), cs["query"]);
        if (retrieval) {
            // Above five tools (spec §9): the five selected by the contrastive head, in
            // declaration order; the prefix is that selection's, through its </tools>.
            const auto &rc = cs["retrieval_convention"];
            CHECK(prompt == rc["prompt"].get<std::string>());
            CHECK(api_test::tokenize(needle2().get(), prompt, true) == rc["engine_input_ids"].get<std::vector<uint32_t>>());
            const std::string conv = rc["prompt"];
            const size_t end = conv.rfind("</tools>") + 8;
            REQUIRE(needle_chat_static_prefix_tokens(c.get(), &n_prefix) == NEEDLE_OK);
            CHECK(n_prefix == api_test::tokenize(needle2().get(), conv.substr(0, end), true).size());
            continue;
        }
        CHECK(prompt == cs["prompt"].get<std::string>());
        const auto file = fixtures::read_bytes(tc(entry["prompt_file"].get<std::string>()));
        CHECK(prompt == std::string(file.begin(), file.end()));
        CHECK(api_test::tokenize(needle2().get(), prompt, true) == cs["engine_input_ids"].get<std::vector<uint32_t>>());
    }
}

TEST_CASE("chat: completion parser splits the fixture targets into reasoning and calls") {
    const auto index = fixtures::read_json(tc("index.json"));
    const auto model = needle::load_model(needle::FileBytes::open(api_test::model_path("needle2").c_str(), true),
                                          needle::LoadOptions{});
    const needle::Tokenizer *tok = model->tokenizer();
    REQUIRE(tok != nullptr);
    int checked = 0;
    for (const auto &entry : index["cases"]) {
        const auto cs = fixtures::read_json(tc(entry["file"].get<std::string>()));
        if (!cs.contains("target") || cs["target"].is_null()) continue;
        INFO("case " << cs["id"].get<std::string>());
        const std::string target = cs["target"];
        // Expected parts, cut from the target text (§3.4 shape).
        const size_t t0 = target.find("<think>") + 7, t1 = target.find("</think>");
        const size_t c0 = target.find("<tool_call>") + 11, c1 = target.find("</tool_call>");
        REQUIRE(t1 != std::string::npos);
        REQUIRE(c1 != std::string::npos);
        const std::vector<uint32_t> ids = cs["target_ids"];
        REQUIRE(!ids.empty());
        // ids end with <|im_end|>; the parser sees what precedes the stop token.
        const std::vector<uint32_t> gen(ids.begin(), ids.end() - 1);
        const needle::chat::MarkerIds mk = needle::chat::marker_ids(*tok);
        const needle::chat::Completion c = needle::chat::parse_completion(*tok, mk, gen.data(), gen.size());
        CHECK(c.reasoning == needle::chat::strip_whitespace(target.substr(t0, t1 - t0)));
        CHECK(c.call_opened);
        CHECK(c.call_closed);
        CHECK(c.payload == target.substr(c0, c1 - c0));
        std::string canon;
        needle::chat::write_canonical(needle::chat::parse_json(c.payload), canon);
        CHECK(canon == target.substr(c0, c1 - c0));  // the target is already canonical (§3.4)
        ++checked;
    }
    CHECK(checked == 14);
}

namespace {
const char kWeatherTool[] =
    R"([{"name": "get_weather", "description": "Get the weather for a city.", "parameters": {"type": "object", )"
    R"("properties": {"city": {"type": "string"}}, "required": ["city"]}}])";

}  // namespace

TEST_CASE("chat: max_new_tokens 3 inside the call gives the official truncated envelope") {
    Chat c = make_chat(tiny().get(), "", kWeatherTool, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    const std::string text = complete_text(c.get(), "What's the weather in Paris?", 3);
    INFO(text);
    const auto env = nlohmann::ordered_json::parse(text);
    check_key_order(env);
    CHECK(env["type"] == "call");
    CHECK(env["success"] == false);
    CHECK(env["error"] == "tool call truncated: token budget exhausted");
    CHECK(env["error_code"] == "truncated");
    CHECK(env["reason"] == "runtime_failure");
    CHECK(env["function_calls"] == nlohmann::json::array());
    CHECK(env["suppressed_calls"] == nlohmann::json::array());
    CHECK(env["reasoning"] == "");  // required: the turn opened with <tool_call>, no think block
    CHECK(env["confidence"].is_number());
    CHECK(env["confidence"].get<double>() >= 0.0);
    CHECK(env["confidence"].get<double>() <= 1.0);
    CHECK(env["prefill_tps"].get<double>() > 0.0);
    CHECK(env["peak_ram_mb"].get<double>() > 0.0);
}

TEST_CASE("chat: a budget spent before any call opened is truncated with its own message") {
    // No tools, auto: the tiny model writes text and never opens <tool_call> in 3 tokens.
    Chat c = make_chat(tiny().get(), "", "[]", params(NEEDLE_TOOL_CHOICE_AUTO));
    const std::string text = complete_text(c.get(), "What's the weather in Paris?", 3);
    INFO(text);
    const auto env = nlohmann::ordered_json::parse(text);
    CHECK(env["success"] == false);
    CHECK(env["error_code"] == "truncated");
    CHECK(env["error"] == "token budget exhausted before a tool call started");
    CHECK(env["function_calls"] == nlohmann::json::array());
}

TEST_CASE("chat: every envelope has the documented keys in order, and reset replays the first turn") {
    for (int32_t choice : {NEEDLE_TOOL_CHOICE_AUTO, NEEDLE_TOOL_CHOICE_REQUIRED, NEEDLE_TOOL_CHOICE_NONE}) {
        INFO("tool_choice " << choice);
        Chat c = make_chat(tiny().get(), "date: 2026-07-21", kWeatherTool, params(choice));
        const std::string first_prompt = render(c.get(), "Weather in Oslo?");
        const auto a = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Oslo?", 24));
        check_key_order(a);
        if (choice == NEEDLE_TOOL_CHOICE_NONE) {
            CHECK(a["type"] == "respond");
            CHECK(a["success"] == true);
            CHECK(a["function_calls"] == nlohmann::json::array());
        }
        // A later turn renders after the previous <|im_end|> and never repeats the tools (§10.2).
        const std::string next = render(c.get(), "and tomorrow?");
        CHECK(next.rfind("<|im_end|>\n<|im_start|>user\n", 0) == 0);
        CHECK(next.find("<tools>") == std::string::npos);
        const auto b = nlohmann::ordered_json::parse(complete_text(c.get(), "and tomorrow?", 8));
        check_key_order(b);
        needle_chat_reset(c.get());
        CHECK(render(c.get(), "Weather in Oslo?") == first_prompt);
        const auto a2 = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Oslo?", 24));
        for (const char *k : {"type", "success", "error", "error_code", "function_calls", "reasoning", "confidence"})
            CHECK_MESSAGE(a2[k] == a[k], k);
    }
}

TEST_CASE("chat: a tool-result turn is rendered inside <tool_result> after a call") {
    // Only a turn that returned calls makes the next text tool results (§10.2 [C]); the
    // rendering is checked against the template function's exact text.
    CHECK(needle::chat::render_later_turn(needle::chat::TurnKind::ToolResults, R"([{"temp_c": 21}])") ==
          "<|im_end|>\n<|im_start|>user\n<tool_result>[{\"temp_c\": 21}]</tool_result><|im_end|>\n<|im_start|>assistant\n");
    CHECK(needle::chat::render_later_turn(needle::chat::TurnKind::FollowUp, "hi") ==
          "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat: buffers of 0, 1, 2 bytes and a too-small buffer follow spec 7.2") {
    Chat c = make_chat(tiny().get(), "", kWeatherTool, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    char small[300];
    size_t len = 0;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(c.get(), "hi", 4, small, 0, &len), "cap");
    small[0] = 'x';
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(c.get(), "hi", 4, small, 1, &len), "cap");
    CHECK(small[0] == '\0');
    // 2 bytes: a valid size, but no envelope fits: "" and BUFFER_TOO_SMALL with the needed length.
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_chat_complete(c.get(), "hi", 4, small, 2, &len), "envelope");
    CHECK(small[0] == '\0');
    CHECK(len > 100);
    needle_chat_reset(c.get());
    // Room for the minimal envelope but not the real one.
    const std::string full = complete_text(c.get(), "hi", 4);
    needle_chat_reset(c.get());
    const size_t cap = 250;  // the minimal envelope is 244 bytes + NUL
    REQUIRE(full.size() + 1 > cap);
    std::memset(small, 'x', sizeof small);
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_chat_complete(c.get(), "hi", 4, small, cap, &len), "envelope");
    CHECK(len + 1 > cap);  // the full length (tps digits vary from run to run)
    const std::string minimal(small);
    INFO(minimal);
    REQUIRE(minimal.size() < cap);
    const auto env = nlohmann::ordered_json::parse(minimal);
    check_key_order(env);
    CHECK(env["type"] == "call");
    CHECK(env["success"] == false);
    CHECK(env["error_code"] == "buffer_too_small");
    CHECK(small[minimal.size() + 1] == 'x');  // nothing written past the NUL
}

TEST_CASE("chat: bad tools, bad text and NULLs give a status with a specific message") {
    needle_model *m = tiny().get();
    needle_chat *c = reinterpret_cast<needle_chat *>(1);
    const needle_chat_params p = params();
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[{\"name\": ", &p, &c), "json|unexpected|end");
    CHECK(c == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "{\"name\": \"x\"}", &p, &c), "array");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[{\"name\": 3}]", &p, &c), "name");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[{\"description\": \"x\"}]", &p, &c), "name");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[3]", &p, &c), "object");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[{\"name\": \"caf\xC3\"}]", &p, &c), "utf-8");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "bad \xFF system", "[]", &p, &c), "utf-8");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(nullptr, "", "[]", &p, &c), "null");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[]", &p, nullptr), "null");
    const needle_chat_params req = params(NEEDLE_TOOL_CHOICE_REQUIRED);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[]", &req, &c), "required");
    needle_chat_params bad = params(7);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[]", &bad, &c), "tool_choice");
    bad = params();
    bad.struct_size = 2;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", "[]", &bad, &c), "struct_size");

    // A tools block too long for the context: refused before tokenising; and a 10 MB list.
    std::string long_tools = "[{\"name\": \"t\", \"description\": \"";
    for (int i = 0; i < 400; ++i) long_tools += "lorem ipsum dolor sit amet ";
    long_tools += "\"}]";
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_chat_create(m, "", long_tools.c_str(), &p, &c), "static prefix");
    // (A 10 MB list: test_chat_retrieval.cpp, "chat: huge tool lists".)
    std::string deep(10000, '[');
    deep += std::string(10000, ']');
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m, "", deep.c_str(), &p, &c), "depth|deep|nest");

    Chat ok = make_chat(m, "", kWeatherTool);
    char buf[4096];
    size_t len = 0;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(ok.get(), nullptr, 4, buf, sizeof buf, &len), "null");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(nullptr, "hi", 4, buf, sizeof buf, &len), "null");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(ok.get(), "hi", 4, nullptr, 10, &len), "null");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_complete(ok.get(), "hi", 0, buf, sizeof buf, &len), "max_new_tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_render(ok.get(), "bad \xC0 text", buf, sizeof buf, &len), "utf-8");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_render(nullptr, "x", buf, sizeof buf, &len), "null");
    // Invalid UTF-8 in a turn is an envelope the application sees (status OK).
    const auto env = nlohmann::ordered_json::parse(complete_text(ok.get(), "bad \xC0 text", 4));
    check_key_order(env);
    CHECK(env["success"] == false);
    CHECK(env["error_code"] == "invalid_input");
    needle_chat_reset(nullptr);
    needle_chat_free(nullptr);
}

TEST_CASE("chat: noise weights with tool_choice required give only schema-valid calls on closed-set schemas") {
    // Every value is a closed set (enum, boolean, bounded integer, bounded array of enums), so
    // the grammar leaves the model no way to write an invalid call: 20 queries, all successful.
    const char *tools =
        R"([{"name": "set_lights", "parameters": {"type": "object", "properties": {)"
        R"("room": {"type": "string", "enum": ["kitchen", "bedroom", "living room"]},)"
        R"("on": {"type": "boolean"},)"
        R"("brightness": {"type": "integer", "minimum": 0, "maximum": 100},)"
        R"("colors": {"type": "array", "items": {"type": "string", "enum": ["red", "warm white"]}, "maxItems": 2}},)"
        R"("required": ["room", "on"]}}])";
    Chat c = make_chat(tiny().get(), "", tools, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    const std::vector<std::string> rooms{"kitchen", "bedroom", "living room"};
    for (int q = 0; q < 20; ++q) {
        needle_chat_reset(c.get());
        const std::string query = "Query " + std::to_string(q) + ": lights in the " + rooms[q % 3] + (q % 2 ? " off" : " on, dim");
        const std::string text = complete_text(c.get(), query, 200);
        INFO(query << " -> " << text);
        const auto env = nlohmann::ordered_json::parse(text);
        check_key_order(env);
        REQUIRE(env["success"] == true);
        REQUIRE(env["function_calls"].size() == 1);  // one tool: exactly one call, never []
        const auto &call = env["function_calls"][0];
        CHECK(call["name"] == "set_lights");
        const auto &args = call["arguments"];
        REQUIRE(args.is_object());
        CHECK(args.contains("room"));
        CHECK(args.contains("on"));
        for (auto it = args.begin(); it != args.end(); ++it) {
            const std::string k = it.key();
            if (k == "room") CHECK(std::find(rooms.begin(), rooms.end(), it.value().get<std::string>()) != rooms.end());
            else if (k == "on") CHECK(it.value().is_boolean());
            else if (k == "brightness") {
                REQUIRE(it.value().is_number_integer());
                CHECK(it.value().get<int>() >= 0);
                CHECK(it.value().get<int>() <= 100);
            } else if (k == "colors") {
                REQUIRE(it.value().is_array());
                CHECK(it.value().size() <= 2);
                for (const auto &v : it.value()) CHECK((v == "red" || v == "warm white"));
            } else {
                FAIL("undeclared key " << k);
            }
        }
    }
}

TEST_CASE("chat: run() loop: a call, then the tool results inside <tool_result>, then respond or call") {
    const char *tools = R"([{"name": "get_weather", "parameters": {"type": "object", "properties": )"
                        R"({"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}])";
    Chat c = make_chat(tiny().get(), "", tools, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    const auto first = nlohmann::ordered_json::parse(complete_text(c.get(), "What's the weather in Paris?", 64));
    REQUIRE(first["success"] == true);
    REQUIRE(first["function_calls"].size() == 1);
    CHECK(first["type"] == "call");
    const std::string results = R"([{"temp_c": 21, "sky": "clear"}])";  // json.dumps, spaces kept
    CHECK(render(c.get(), results) == "<|im_end|>\n<|im_start|>user\n<tool_result>" + results +
                                          "</tool_result><|im_end|>\n<|im_start|>assistant\n");
    const auto second = nlohmann::ordered_json::parse(complete_text(c.get(), results, 64));
    check_key_order(second);
    INFO(second.dump());
    REQUIRE(second["success"] == true);
    // §7.1 [C]: "respond" exactly when tool results were answered with [].
    CHECK(second["type"] == (second["function_calls"].empty() ? "respond" : "call"));
    // After a turn without calls the next text is a follow-up query, not tool results.
    if (second["function_calls"].empty()) CHECK(render(c.get(), "thanks").find("<tool_result>") == std::string::npos);
}

TEST_CASE("chat: a conversation that reaches max_seq_len fails with context_full until reset") {
    Chat c = make_chat(tiny().get(), "", kWeatherTool, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    std::string code, last_error_text;
    int turns = 0;
    for (; turns < 40 && code != "context_full"; ++turns) {
        const auto env = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Paris? And in Oslo, Rome, Madrid?", 48));
        check_key_order(env);
        code = env["error_code"].is_null() ? "" : env["error_code"].get<std::string>();
        last_error_text = env["error"].is_null() ? "" : env["error"].get<std::string>();
    }
    CHECK(code == "context_full");
    CHECK(turns > 1);
    CHECK(last_error_text.find("; call reset") != std::string::npos);
    needle_chat_reset(c.get());
    const auto env = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Paris?", 48));
    CHECK(env["error_code"] != "context_full");
}

TEST_CASE("chat: a query too long for max_seq_len says so, not 'call reset', on the first turn and later") {
    Chat c = make_chat(tiny().get(), "", kWeatherTool, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    std::string query;
    while (query.size() < 20000) query += "Weather in Paris? ";
    const auto env = nlohmann::ordered_json::parse(complete_text(c.get(), query.c_str(), 48));
    check_key_order(env);
    INFO(env.dump());
    CHECK(env["success"] == false);
    CHECK(env["error_code"] == "context_full");
    const std::string error = env["error"].get<std::string>();
    CHECK(error.find("the query is too long for this model and tools") != std::string::npos);
    CHECK(error.find("call reset") == std::string::npos);
    // The chat is unharmed: a short query still runs.
    const auto next = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Paris?", 48));
    INFO(next.dump());
    CHECK(next["error_code"] != "context_full");
    // After that turn the same text still cannot fit, reset or not: it says so ("call reset" was
    // advice that could not help).
    const auto later = nlohmann::ordered_json::parse(complete_text(c.get(), query.c_str(), 48));
    INFO(later.dump());
    CHECK(later["error_code"] == "context_full");
    const std::string later_error = later["error"].get<std::string>();
    CHECK(later_error.find("too long for this model and tools, even after a reset") != std::string::npos);
    CHECK(later_error.find("call reset") == std::string::npos);
}

TEST_CASE("chat: reset restores the static prefix from its copy (no prefill) and replays the turn") {
    const char *tools = R"([{"name": "get_weather", "parameters": {"type": "object", "properties": )"
                        R"({"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}])";
    Chat c = make_chat(tiny().get(), "date: 2026-07-21", tools, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    uint32_t n_prefix = 0;
    REQUIRE(needle_chat_static_prefix_tokens(c.get(), &n_prefix) == NEEDLE_OK);
    const size_t n_turn = api_test::tokenize(tiny().get(), render(c.get(), "Weather in Oslo?"), true).size() - n_prefix;
    needle_chat_stats s1{}, s2{};
    s1.struct_size = s2.struct_size = sizeof s1;
    const auto a = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Oslo?", 48));
    REQUIRE(needle_chat_last_stats(c.get(), &s1) == NEEDLE_OK);
    CHECK(s1.prefill_tokens == n_prefix + n_turn);  // first turn: the prefix is run here
    CHECK(s1.call_tokens > 0);
    CHECK(s1.generated_tokens >= s1.call_tokens);
    CHECK(s1.grammar_ms <= s1.decode_ms);
    CHECK(s1.p_decode > 0.0);
    CHECK(s1.p_decode <= 1.0);
    // tiny has a confidence head: confidence = min(head, decode) rounded to 4 decimals (§8).
    REQUIRE(s1.p_head >= 0.0);
    CHECK(s1.p_head <= 1.0);
    CHECK(std::abs(a["confidence"].get<double>() - std::min(s1.p_head, s1.p_decode)) <= 0.5e-4 + 1e-12);
    needle_chat_reset(c.get());
    const auto b = nlohmann::ordered_json::parse(complete_text(c.get(), "Weather in Oslo?", 48));
    REQUIRE(needle_chat_last_stats(c.get(), &s2) == NEEDLE_OK);
    CHECK(s2.prefill_tokens == n_turn);  // the prefix came from the copy
    CHECK(b["function_calls"] == a["function_calls"]);
    CHECK(b["reasoning"] == a["reasoning"]);
    CHECK(s2.p_decode == s1.p_decode);  // bit-identical continuation
    CHECK(s2.p_head == s1.p_head);
    needle_chat_stats bad{};
    bad.struct_size = 4;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_last_stats(c.get(), &bad), "struct_size");
}
