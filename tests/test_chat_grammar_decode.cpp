// Constrained decoding through the grammar's token masks on random-weight fixture models
// (issue 9 tests): with the refusal disabled (tool_choice required), closed-set schemas
// (enums, booleans, bounded integers, bounded arrays of enums) must give, for 20 queries each,
// a payload that parses and validates — noise weights cannot produce an invalid call. Also the
// mask cost per token on the 8192-token vocabulary (MESSAGE; bound only outside sanitizers).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "api_util.h"
#include "chat/grammar.h"
#include "chat/json.h"
#include "fixtures.h"
#include "model/model.h"

using namespace needle::chat;

namespace {

std::string canon(const JsonValue &v) {
    std::string s;
    write_canonical(v, s);
    return s;
}

// Test-side validator of the closed-set keywords used below (independent of the grammar code).
std::string validate(const JsonValue &s, const JsonValue &v, const std::string &path) {
    if (const JsonValue *e = s.find("enum")) {
        for (const auto &x : e->items)
            if (canon(x) == canon(v)) return "";
        return path + ": not in enum: " + canon(v);
    }
    const std::string type = s.find("type") ? s.find("type")->text : "";
    using K = JsonValue::Kind;
    if (type == "boolean") return v.kind == K::True || v.kind == K::False ? "" : path + ": not a boolean";
    if (type == "integer") {
        if (v.kind != K::Int) return path + ": not an integer";
        if (s.find("minimum") && v.number < s.find("minimum")->number) return path + ": below minimum";
        if (s.find("maximum") && v.number > s.find("maximum")->number) return path + ": above maximum";
        return "";
    }
    if (type == "array") {
        if (v.kind != K::Array) return path + ": not an array";
        if (s.find("minItems") && v.items.size() < s.find("minItems")->number) return path + ": too few items";
        if (s.find("maxItems") && v.items.size() > s.find("maxItems")->number) return path + ": too many items";
        for (const auto &it : v.items) {
            std::string r = validate(*s.find("items"), it, path + "[]");
            if (!r.empty()) return r;
        }
        return "";
    }
    if (type == "object") {
        if (v.kind != K::Object) return path + ": not an object";
        const JsonValue *props = s.find("properties");
        for (const auto &[k, x] : v.members) {
            const JsonValue *ps = props->find(k);
            if (!ps) return path + ": unknown key " + k;
            std::string r = validate(*ps, x, path + "." + k);
            if (!r.empty()) return r;
        }
        if (const JsonValue *req = s.find("required"))
            for (const auto &r : req->items)
                if (!v.find(r.text)) return path + ": missing required " + r.text;
        return "";
    }
    return path + ": unexpected schema";
}

const char *const kClosedTools[] = {
    R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Tokyo","Lima"]},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}])",
    R"([{"name":"lights","parameters":{"type":"object","properties":{"on":{"type":"boolean"},"dim":{"type":"boolean"}},"required":["on"]}}])",
    R"([{"name":"set_timer","parameters":{"type":"object","properties":{"seconds":{"type":"integer","minimum":1,"maximum":86400},"level":{"type":"integer","minimum":-5,"maximum":5}},"required":["seconds"]}}])",
    R"([{"name":"alarm","parameters":{"type":"object","properties":{"days":{"type":"array","items":{"enum":["mon","tue","wed","thu","fri","sat","sun"]},"minItems":1,"maxItems":3},"mode":{"enum":["loud",1,null]}},"required":["days"]}}])",
};

}  // namespace

TEST_CASE("chat grammar: masked decoding of a random-weight model always gives valid calls") {
    api_test::Model model = api_test::load(api_test::model_path("tiny"));
    needle_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    REQUIRE(needle_model_get_info(model.get(), &info) == NEEDLE_OK);
    const uint32_t V = info.vocab_size;
    auto internal = needle::load_model(needle::FileBytes::open(api_test::model_path("tiny").c_str(), true), {});
    const TokenBytes tb(*internal->tokenizer());
    REQUIRE(tb.size() == V);
    REQUIRE(tb.end_call_id() >= 0);
    std::vector<float> logits(V);
    std::vector<uint64_t> mask(tb.words());
    GrammarOptions opt;
    opt.require_call = true;
    double mask_seconds = 0;
    size_t mask_calls = 0;
    for (const char *tools_json : kClosedTools) {
        const JsonValue tools = parse_json(tools_json);
        const auto g = Grammar::compile({&tools.items[0]}, opt);
        GrammarMatcher m(g, tb);
        for (int q = 0; q < 20; ++q) {
            const std::string prompt = std::string("<|im_start|>user\n<tools>") + tools_json + "</tools>\nquery " +
                                       std::to_string(q * 7919) + "<|im_end|>\n<|im_start|>assistant\n<tool_call>";
            std::vector<uint32_t> ids(4096);
            size_t n = 0;
            REQUIRE(needle_model_tokenize(model.get(), prompt.c_str(), prompt.size(), 1, ids.data(), ids.size(), &n) == NEEDLE_OK);
            api_test::State st = api_test::new_state(model.get());
            REQUIRE(needle_state_prefill(st.get(), nullptr, ids.data(), n, logits.data(), V) == NEEDLE_OK);
            m.reset();
            std::mt19937 rng{uint32_t(q)};
            std::string payload;
            bool ended = false;
            for (int step = 0; step < 400 && !ended; ++step) {
                const auto t0 = std::chrono::steady_clock::now();
                const size_t allowed = m.fill_mask(mask.data());
                mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                ++mask_calls;
                REQUIRE(allowed > 0);
                // Even queries greedy, odd ones sampled (temperature 1) among the allowed ids.
                uint32_t pick = UINT32_MAX;
                if (q % 2 == 0) {
                    for (uint32_t id = 0; id < V; ++id)
                        if (((mask[id / 64] >> (id % 64)) & 1) && (pick == UINT32_MAX || logits[id] > logits[pick])) pick = id;
                } else {
                    float mx = -INFINITY;
                    for (uint32_t id = 0; id < V; ++id)
                        if ((mask[id / 64] >> (id % 64)) & 1) mx = std::max(mx, logits[id]);
                    double total = 0;
                    std::vector<double> w(V, 0.0);
                    for (uint32_t id = 0; id < V; ++id)
                        if ((mask[id / 64] >> (id % 64)) & 1) total += w[id] = std::exp(double(logits[id] - mx));
                    double r = std::uniform_real_distribution<double>(0, total)(rng);
                    for (uint32_t id = 0; id < V && pick == UINT32_MAX; ++id)
                        if (w[id] > 0 && (r -= w[id]) <= 0) pick = id;
                    if (pick == UINT32_MAX)
                        for (uint32_t id = V; id-- > 0 && pick == UINT32_MAX;)
                            if (w[id] > 0) pick = id;
                }
                REQUIRE(pick != UINT32_MAX);
                const bool was_complete = m.complete();
                REQUIRE(m.accept(pick));
                if (was_complete) {
                    CHECK(int64_t(pick) == tb.end_call_id());
                    ended = true;
                } else {
                    payload += tb.bytes(pick);
                }
                REQUIRE(needle_state_decode(st.get(), pick, logits.data(), V) == NEEDLE_OK);
            }
            INFO("tools " << tools_json << "\npayload " << payload);
            REQUIRE(ended);
            const JsonValue calls = parse_json(payload);
            REQUIRE(calls.kind == JsonValue::Kind::Array);
            REQUIRE(calls.items.size() == 1);
            const JsonValue &c = calls.items[0];
            CHECK(c.find("name")->text == tools.items[0].find("name")->text);
            CHECK(validate(*tools.items[0].find("parameters"), *c.find("arguments"), "arguments") == "");
            CHECK(post_check(*g, calls) == "");
        }
    }
    MESSAGE("tiny (V=" << V << "): fill_mask " << 1e6 * mask_seconds / double(mask_calls) << " us per token over "
                       << mask_calls << " tokens");
}

TEST_CASE("chat grammar: mask cost per token on the 8192-token vocabulary") {
    auto m8 = needle::load_model(needle::FileBytes::open(fixtures::v2("models/needle2.cact").c_str(), true), {});
    const needle::Tokenizer &tok = *m8->tokenizer();
    const TokenBytes tb(tok);
    const JsonValue tools = parse_json(R"([{"name":"send_message","parameters":{"type":"object","properties":{"to":{"type":"string","maxLength":40},"body":{"type":"string"},"priority":{"type":"integer","minimum":1,"maximum":5},"tags":{"type":"array","items":{"type":"string"}}},"required":["to","body"]}},{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},{"name":"free","parameters":{"type":"object"}}])");
    std::vector<const JsonValue *> ptrs;
    for (const auto &t : tools.items) ptrs.push_back(&t);
    const auto g = Grammar::compile(ptrs, {});
    const std::string payload = R"([{"name":"send_message","arguments":{"to":"Alice Martin","body":"Running ten minutes late for the meeting, please start without me and I will join as soon as I can. \u00c7a va?","priority":3,"tags":["work","urgent"]}},{"name":"get_weather","arguments":{"city":"San Francisco"}},{"name":"free","arguments":{"k":[1,2.5,{"x":null}],"s":"text"}}])";
    std::vector<uint32_t> ids;
    tok.encode(payload, ids);
    // encode() adds the dummy-prefix space: drop a leading lone "▁" token, then feed the rest.
    GrammarMatcher m(g, tb);
    std::vector<uint64_t> mask(tb.words());
    double secs = 0, worst = 0;
    size_t steps = 0;
    const int reps = fixtures::kSanitized ? 1 : 5;
    for (int r = 0; r < reps; ++r) {
        m.reset();
        std::string fed;
        for (uint32_t id : ids) {
            std::string_view b = tb.bytes(id);
            if (fed.empty() && !b.empty() && b[0] == ' ') b.remove_prefix(1);
            if (b.empty()) continue;
            const auto t0 = std::chrono::steady_clock::now();
            const size_t n = m.fill_mask(mask.data());
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            secs += dt, worst = std::max(worst, dt), ++steps;
            REQUIRE(n > 0);
            // The real token (or its bytes one by one) must be allowed.
            if (b.size() == tb.bytes(id).size()) {
                REQUIRE(((mask[id / 64] >> (id % 64)) & 1) == 1);
                REQUIRE(m.accept(id));
            } else {
                REQUIRE(m.accept_bytes(b));
            }
            fed += b;
        }
        REQUIRE(m.complete());
    }
    const double avg_us = 1e6 * secs / double(steps);
    MESSAGE("V=8192: fill_mask " << avg_us << " us per token on average, worst " << 1e6 * worst << " us, over "
                                 << steps << " tokens (" << ids.size() << " per payload)");
    if (!fixtures::kSanitized) CHECK(avg_us < 2000);  // loose: the machine is shared; the figure is reported
}
