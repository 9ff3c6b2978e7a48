// The committed demo model (issue 10; models/README.md is its card): the engine reproduces the
// trainer's logits, the built-in copy is the committed file, and the model still calls the
// demo tools on the held-out split through needle_chat (greedy, grammar on, tool_choice auto),
// above floors set just below what was measured when it was exported.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

namespace {

using api_test::Model;
using nlohmann::json;

// Floors of one held-out file: shares of tool queries answered with exactly the calls and of
// off-topic queries answered with [], and the most truncated turns (the grammar leaves no
// other failure); just under what the committed model measured when it was exported
// (models/README.md). A retrained model raises them.
struct Floors {
    double exact_calls;
    double off_topic_empty;
    int max_failed_turns;
};
// needle-demo.heldout.json: the held-out split of the compositional generator (the third to
// twenty-fourth models'): measured 0.764 / 0.841 / 3 failed turns (round 24; round 21 0.762 /
// 0.855 / 0, round 18 0.736 / 0.870 / 0, round 15 0.712 / 0.807 / 3, round 13 0.661 / 0.729 /
// 0, round 12 0.588 / 0.744 / 0, round 11 0.588 / 0.734 / 0, round 7 0.575 / 0.773 / 0, round
// 4 0.453 / 0.589 / 3).
constexpr Floors kHeldout = {0.74, 0.82, 5};
// needle-demo.heldout-v2.json: the second demo model's held-out file (another generator, kept
// as a second yardstick; none of its templates is in the training data): measured 0.902 /
// 0.953 / 4 (round 24; round 21 0.902 / 0.953 / 0; round 18 0.886 / 0.980 / 1; round 15 0.840 /
// 0.987 / 3; round 13 0.826 / 0.913 / 0; round 12 0.787 / 0.980 / 1; round 11 0.735 / 0.953 /
// 0; round 7 0.729 / 0.953 / 0).
constexpr Floors kHeldoutV2 = {0.88, 0.93, 6};
// needle-demo.unseen-tools.json: ten tools no training set contains (set_thermostat, send_email,
// ...; tools/train/anytool.py), each alone in its tools block, held-out phrasings, every seventh
// query off-topic: measured 0.461 / 0.762 (32 of 42) / 4 failed turns (round 24, whose
// unseen-tools stage ran at half round 21's learning rate; a failed turn is a free-text value
// that loops until the 96-token budget ends; round 21 0.500 / 0.881 / 25, round 18 0.558 /
// 0.786 / 29, round 15 0.492 / 0.976 / 22, round 13 0.612 / 0.857 / 29, round 12 0.550 / 0.905
// / 37, round 11 0.484 / 1.000 / 43). Round 7, trained on the four demo tools only: 0.047 /
// 0.310 / 116.
constexpr Floors kUnseenTools = {0.44, 0.74, 10};
constexpr float kLogitTol = 1e-4f;

std::string models_file(const std::string &name) { return std::string(NEEDLE_MODELS_DIR) + "/" + name; }

json read_json(const std::string &path) {
    const std::vector<uint8_t> bytes = fixtures::read_bytes(path);
    return json::parse(bytes.begin(), bytes.end());
}

Model builtin_or_file() {
    needle_model *m = nullptr;
    if (needle_model_load_builtin(nullptr, &m) == NEEDLE_OK) return Model(m);
    return api_test::load(NEEDLE_DEMO_MODEL);
}

std::string tools_text() {
    const char *t = needle_builtin_tools_json();
    if (t) return t;
    const std::vector<uint8_t> b = fixtures::read_bytes(models_file("needle-demo.tools.json"));
    return std::string(b.begin(), b.end());
}

// Checks `m` against the trainer's reference: same ids for each prompt, last-position logits
// within kLogitTol, same argmax.
void check_reference(needle_model *m) {
    const json ref = read_json(models_file("needle-demo.ref.json"));
    REQUIRE(ref.at("format") == "needle-demo-ref/1");
    const size_t V = api_test::info_of(m).vocab_size;
    api_test::Batch batch = api_test::new_batch(m, 32);
    REQUIRE(ref.at("prompts").size() >= 3);
    for (const json &p : ref.at("prompts")) {
        const std::string text = p.at("text");
        INFO("prompt " << text.substr(text.size() > 60 ? text.size() - 60 : 0));
        const std::vector<uint32_t> ids = api_test::tokenize(m, text, true);
        CHECK(ids == p.at("ids").get<std::vector<uint32_t>>());
        api_test::State s = api_test::new_state(m);
        const std::vector<float> lg = api_test::prefill(s.get(), batch.get(), ids, V);
        const std::vector<float> want = p.at("logits").get<std::vector<float>>();
        REQUIRE(want.size() == V);
        float worst = 0;
        for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(lg[i] - want[i]));
        CHECK(worst <= kLogitTol);
        CHECK(api_test::argmax(lg) == p.at("argmax").get<uint32_t>());
    }
}

struct ChatDel {
    void operator()(needle_chat *c) const { needle_chat_free(c); }
};

using Chat = std::unique_ptr<needle_chat, ChatDel>;

Chat new_chat(needle_model *m, const std::string &tools) {
    needle_chat_params cp;
    cp.struct_size = sizeof cp;
    needle_chat_params_init(&cp);
    needle_chat *raw = nullptr;
    REQUIRE(needle_chat_create(m, "", tools.c_str(), &cp, &raw) == NEEDLE_OK);
    return Chat(raw);
}

// Runs every example of models/`file` through needle_chat (greedy, grammar on, tool_choice
// auto, a fresh conversation each) and checks the shares against `floors`. An example with a
// "tools" field (the unseen-tools file) runs against those tools, the others against the demo's.
void check_heldout(const std::string &file, const Floors &floors) {
    const json held = read_json(models_file(file));
    REQUIRE(held.at("format") == "needle-demo-heldout/2");
    Model m = builtin_or_file();
    const std::string demo_tools = tools_text();
    std::map<std::string, Chat> chats;  // tools JSON -> its chat

    std::map<std::string, std::pair<int, int>> per_kind;  // kind -> (exact, total)
    int failed_turns = 0;
    std::vector<char> out(65536);
    for (const json &ex : held.at("examples")) {
        const std::string tools = ex.value("tools", demo_tools);
        Chat &chat = chats[tools];
        if (!chat) chat = new_chat(m.get(), tools);
        needle_chat_reset(chat.get());
        const std::string query = ex.at("query");
        size_t len = 0;
        REQUIRE(needle_chat_complete(chat.get(), query.c_str(), 96, out.data(), out.size(), &len) == NEEDLE_OK);
        const json env = json::parse(std::string(out.data(), len));
        failed_turns += env.at("success") == false;  // truncated or schema violation
        const bool exact = env.at("success") == true && env.at("function_calls") == ex.at("calls");
        auto &k = per_kind[ex.at("kind").get<std::string>()];
        k.first += exact;
        k.second += 1;
    }
    int exact = 0, total = 0;
    for (const auto &[kind, k] : per_kind) {
        MESSAGE(file << " " << kind << ": " << k.first << "/" << k.second);
        if (kind != "off_topic") exact += k.first, total += k.second;
    }
    REQUIRE(total > 0);
    REQUIRE(per_kind.count("off_topic"));
    const auto &off = per_kind["off_topic"];
    CHECK(double(exact) / total >= floors.exact_calls);
    CHECK(double(off.first) / off.second >= floors.off_topic_empty);
    CHECK(failed_turns <= floors.max_failed_turns);
}

}  // namespace

TEST_CASE("demo model: engine logits equal the trainer's reference") {
    Model file = api_test::load(NEEDLE_DEMO_MODEL);
    check_reference(file.get());
}

TEST_CASE("demo model: the built-in model is models/needle-demo.cact") {
    needle_model *m = nullptr;
    const needle_status st = needle_model_load_builtin(nullptr, &m);
    if (st == NEEDLE_E_UNSUPPORTED) {
        CHECK(m == nullptr);
        CHECK(needle_builtin_tools_json() == nullptr);
        MESSAGE("built with NEEDLE_BUILTIN_MODEL=OFF: skipped");
        return;
    }
    REQUIRE(st == NEEDLE_OK);
    Model builtin(m);
    const std::vector<uint8_t> bytes = fixtures::read_bytes(models_file("needle-demo.cact"));
    CHECK(api_test::info_of(builtin.get()).file_bytes == bytes.size());
    check_reference(builtin.get());
    const std::vector<uint8_t> tools = fixtures::read_bytes(models_file("needle-demo.tools.json"));
    CHECK(std::string(needle_builtin_tools_json()) == std::string(tools.begin(), tools.end()));
    CHECK(needle_model_load_builtin(nullptr, nullptr) == NEEDLE_E_INVALID_ARGUMENT);
    needle_model_params p;
    p.struct_size = 4;  // too short: the message names the call the caller made
    CHECK(needle_model_load_builtin(&p, &m) == NEEDLE_E_INVALID_ARGUMENT);
    CHECK(std::string(needle_last_error()).rfind("needle_model_load_builtin: params.struct_size 4 <", 0) == 0);
}

TEST_CASE("demo model: held-out accuracy through needle_chat") {
    check_heldout("needle-demo.heldout.json", kHeldout);
}

TEST_CASE("demo model: accuracy on the previous model's held-out file") {
    check_heldout("needle-demo.heldout-v2.json", kHeldoutV2);
}

TEST_CASE("demo model: calls tools it was never trained on (the unseen-tools held-out file)") {
    check_heldout("needle-demo.unseen-tools.json", kUnseenTools);
}

TEST_CASE("demo model: needle_init without needle_load or NEEDLE_MODEL uses the built-in model") {
    if (!needle_builtin_tools_json()) {
        MESSAGE("built with NEEDLE_BUILTIN_MODEL=OFF: skipped");
        return;
    }
    if (const char *env = std::getenv("NEEDLE_MODEL"); env && *env) {
        MESSAGE("NEEDLE_MODEL is set: skipped");
        return;
    }
    // The upstream API's model is process-wide: this holds only if no earlier test in this
    // process called needle_load (none of the doctest cases does).
    REQUIRE(needle_init("", needle_builtin_tools_json(), nullptr) == 0);
    std::vector<char> out(65536);
    REQUIRE(needle_complete("Set a timer for 5 minutes", 96, out.data(), int(out.size())) == 0);
    const json env = json::parse(out.data());
    INFO(env.dump());
    // The demo call: exactly one set_timer with 300 seconds and no label.
    REQUIRE(env.at("function_calls").size() == 1);
    const json &call = env.at("function_calls")[0];
    CHECK(call.at("name") == "set_timer");
    CHECK(call.at("arguments") == json{{"seconds", 300}});
}
