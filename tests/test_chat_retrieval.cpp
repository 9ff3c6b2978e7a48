// Tool retrieval wired into the chat (tool-calling.md §9, §10.3): the fixture's retrieval
// convention through the chat, the index file through needle_chat_create / needle_init, the
// selection of follow-up and tool-result turns, and the cost of huge tool lists (issue 9 item 5).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "api_util.h"
#include "chat/chat.h"
#include "core/error.h"
#include "fixtures.h"
#include "needle.h"

namespace {

using namespace needle;

std::shared_ptr<const Model> load_v2(const std::string &name) {
    return load_model(FileBytes::open(fixtures::v2("models/" + name + ".cact").c_str(), true), LoadOptions{});
}

std::string temp_path(const char *tag) {
    return "/tmp/needle_test_" + std::to_string(::getpid()) + "_" + tag + ".idx";
}

bool exists(const std::string &p) { return std::ifstream(p).good(); }

// n tools with distinct names, varied descriptions and one enum argument (for needle2's 2,048
// positions); `extra` is appended to tool 3's description.
std::string make_tools(int n, const std::string &extra = "") {
    static const char *what[] = {"Lock a door.", "Play music.", "Set a timer.", "Send a text message.",
                                 "Create a note.", "Start the robot vacuum.", "Run the irrigation system.",
                                 "Open or close the blinds.", "Book a table.", "Order a taxi."};
    std::string s = "[";
    for (int i = 0; i < n; ++i) {
        if (i) s += ", ";
        s += "{\"name\": \"tool_" + std::to_string(i) + "\", \"description\": \"" + what[i % 10] +
             (i == 3 ? extra : "") + "\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
             "{\"enum\": [\"a\", \"b\"]}}, \"required\": [\"x\"]}}";
    }
    return s + "]";
}

const std::vector<std::string> kQueries{"close the bedroom blinds halfway", "play some jazz in the kitchen",
                                        "remind me in ten minutes",         "text mom that I am late",
                                        "water the garden zone two",        "vacuum the living room",
                                        "lock the front door",              "write down: milk, eggs, bread",
                                        "get me a taxi to the airport",     "a table for two at eight"};

// n bare tools {"name": "tN"} (tiny's 512 positions: five leave room for a turn); `extra` is
// appended to tool 3's name.
std::string make_names(int n, const std::string &extra = "") {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::string("{\"name\": \"t") + std::to_string(i) + (i == 3 ? extra : "") + "\"}";
    return s + "]";
}

chat::ChatOptions opts(const std::string &index = "", chat::ToolChoice choice = chat::ToolChoice::Auto) {
    chat::ChatOptions o;
    o.tool_index_path = index;
    o.tool_choice = choice;
    return o;
}

needle_chat_params params_with_index(const char *path) {
    needle_chat_params p;
    p.struct_size = sizeof p;
    needle_chat_params_init(&p);
    p.tool_index_path = path;
    return p;
}

std::string c_render(needle_chat *c, const std::string &text) {
    size_t len = 0;
    needle_chat_render(c, text.c_str(), nullptr, 0, &len);
    std::string s(len + 1, '\0');
    REQUIRE(needle_chat_render(c, text.c_str(), &s[0], s.size(), &len) == NEEDLE_OK);
    s.resize(len);
    return s;
}

size_t index_file_size(uint32_t dim, size_t n) { return 8 + 4 + 32 + 4 + 4 + n * (32 + 4 * size_t(dim)); }

}  // namespace

TEST_CASE("chat retrieval: the fixture's retrieval_convention through the chat (needle2)") {
    const auto c = fixtures::read_json(fixtures::dir() + "/tool-calling/cases/retrieval_eight_tools.json");
    const auto &rc = c["retrieval_convention"];
    auto m = load_v2("needle2");
    chat::Chat ch(m, std::string(c["system"]), std::string(c["engine_tools_json"]), opts());
    REQUIRE(ch.tool_index() != nullptr);
    CHECK(ch.tool_index()->size() == 8);
    CHECK(ch.selection().empty());  // no query yet
    CHECK(ch.tools_canonical() == std::string(c["tools_rendered"]));  // the catalogue: every tool
    const std::string query = c["query"];
    const std::string prompt = ch.render(query);
    CHECK(prompt == std::string(rc["prompt"]));
    CHECK(ch.selection() == rc["selected_in_declaration_order"].get<std::vector<uint32_t>>());
    std::vector<uint32_t> ids{m->tokenizer()->bos_id()};
    m->tokenizer()->encode(prompt, ids);
    const std::vector<uint32_t> want = rc["engine_input_ids"];
    CHECK(ids == want);
    // The static prefix is the selection's: the fixture ids through the closing </tools>.
    const std::vector<uint32_t> &prefix = ch.static_prefix_ids();
    REQUIRE(prefix.size() < want.size());
    CHECK(std::vector<uint32_t>(want.begin(), want.begin() + std::ptrdiff_t(prefix.size())) == prefix);
    CHECK(prefix.back() == m->tokenizer()->find("</tools>"));
    // The turn prefills exactly those ids (prefix and turn); one token is enough to see it.
    const std::string env = ch.complete(query, 1);
    INFO(env);
    CHECK(ch.last_stats().prefill_tokens == want.size());
    CHECK(ch.selection() == rc["selected_in_declaration_order"].get<std::vector<uint32_t>>());
}

TEST_CASE("chat retrieval: five tools or fewer, or retrieval off: every tool rendered") {
    auto tiny = load_v2("tiny");
    chat::Chat five(tiny, "", make_names(5), opts());
    CHECK(five.tool_index() == nullptr);
    CHECK(five.selection() == std::vector<uint32_t>{0, 1, 2, 3, 4});
    // The switch (ChatOptions::retrieval_k 0), as a model without the contrastive head gets
    // (the one fixture model without it, odd, has no room for a chat: see the huge-list case).
    chat::ChatOptions off = opts(temp_path("off"));
    off.retrieval_k = 0;
    chat::Chat eight(tiny, "", make_names(8), off);
    CHECK(eight.tool_index() == nullptr);
    CHECK(eight.selection().size() == 8);
    CHECK(eight.render("q").find("<tools>" + eight.tools_canonical() + "</tools>") != std::string::npos);
    CHECK(!exists(temp_path("off")));  // nothing to persist
}

TEST_CASE("chat retrieval: the grammar covers only the selected tools") {
    auto m = load_v2("needle2");
    chat::Chat ch(m, "", make_tools(8), opts("", chat::ToolChoice::Required));
    const chat::TokenBytes tb(*m->tokenizer());
    for (size_t k = 0; k < 3; ++k) {
        ch.render(kQueries[k]);  // a first turn: the selection becomes the chat's
        REQUIRE(ch.selection().size() == 5);
        REQUIRE(ch.grammar() != nullptr);
        for (uint32_t i = 0; i < 8; ++i) {
            chat::GrammarMatcher gm(ch.grammar(), tb);
            const std::string call = "[{\"name\":\"tool_" + std::to_string(i) + "\",\"arguments\":{\"x\":\"a\"}}]";
            const bool selected = std::count(ch.selection().begin(), ch.selection().end(), i) == 1;
            CHECK_MESSAGE(gm.accept_bytes(call) == selected, kQueries[k] << ": " << call);
        }
    }
}

TEST_CASE("chat retrieval: a follow-up that selects other tools re-feeds the new prefix and the transcript") {
    auto m = load_v2("needle2");
    const std::string tools = make_tools(8);
    // Two queries with different selections (the synthetic head ranks at random: search a few).
    chat::Chat probe(m, "", tools, opts());
    std::vector<std::string> qs;
    std::vector<std::vector<uint32_t>> sels;
    for (size_t i = 0; i < kQueries.size() && qs.size() < 2; ++i) {
        const std::string &q = kQueries[i];
        probe.render(q);
        if (qs.empty() || probe.selection() != sels[0]) qs.push_back(q), sels.push_back(probe.selection());
    }
    REQUIRE(qs.size() == 2);

    chat::Chat ch(m, "", tools, opts("", chat::ToolChoice::None));  // no calls: turn 2 is a follow-up
    ch.complete(qs[0], 6);
    const chat::TurnStats t1 = ch.last_stats();
    const uint32_t n1 = ch.static_prefix_tokens();
    CHECK(ch.selection() == sels[0]);
    CHECK(t1.prefill_tokens > n1);
    const std::string later = chat::render_later_turn(chat::TurnKind::FollowUp, qs[1]);
    const std::string r = ch.render(qs[1]);
    CHECK(ch.selection() == sels[0]);  // rendering a follow-up changes nothing
    CHECK(r.rfind("<|im_start|>user\n<tools>[", 0) == 0);  // the new static prefix first
    CHECK(r.find("</tools>\n" + qs[0] + "<|im_end|>\n<|im_start|>assistant\n") != std::string::npos);
    CHECK(r.size() > later.size());
    CHECK(r.compare(r.size() - later.size(), later.size(), later) == 0);
    ch.complete(qs[1], 6);
    CHECK(ch.selection() == sels[1]);
    const uint32_t n2 = ch.static_prefix_tokens();
    const chat::MarkerIds mk = chat::marker_ids(*m->tokenizer());
    std::vector<uint32_t> turn2;
    chat::encode_continuation(*m->tokenizer(), mk, later, turn2);
    const size_t transcript = (t1.prefill_tokens - n1) + t1.generated_tokens;
    CHECK(ch.last_stats().prefill_tokens == n2 + transcript + turn2.size());
    // The same text again: nothing to rebuild, only the turn is fed.
    const std::string again = ch.render(qs[1]);
    CHECK(again == chat::render_later_turn(chat::TurnKind::FollowUp, qs[1]));
    // The rebuild kept a copy of the new prefix: after reset, a first turn with that selection
    // prefills only its own ids.
    ch.reset();
    ch.complete(qs[1], 2);
    std::vector<uint32_t> first;
    chat::encode_continuation(*m->tokenizer(), mk, "</tools>" + chat::render_first_turn_suffix(qs[1]), first);
    CHECK(ch.last_stats().prefill_tokens == first.size() - 1);
    // Back to the first selection: its prefix is prefilled again (one copy is kept).
    ch.reset();
    ch.complete(qs[0], 2);
    CHECK(ch.selection() == sels[0]);
    CHECK(ch.last_stats().prefill_tokens == t1.prefill_tokens);
}

TEST_CASE("chat retrieval: a tool-result turn keeps the previous turn's selection") {
    auto m = load_v2("needle2");
    const std::string tools = make_tools(8);
    chat::ChatOptions po = opts();
    po.retrieval_k = 1;
    chat::Chat probe(m, "", tools, po);
    const std::string q = kQueries[0];
    probe.render(q);
    const std::vector<uint32_t> sel = probe.selection();
    std::string other;  // a text that, as a query, would select other tools
    for (size_t i = 1; i < kQueries.size() && other.empty(); ++i) {
        probe.render(kQueries[i]);
        if (probe.selection() != sel) other = kQueries[i];
    }
    REQUIRE(!other.empty());
    // One tool per selection: the grammar then closes the list after one call, so even noise
    // weights write a complete call quickly.
    chat::ChatOptions o = opts("", chat::ToolChoice::Required);
    o.retrieval_k = 1;
    chat::Chat ch(m, "", tools, o);
    const auto first = nlohmann::json::parse(ch.complete(q, 200));
    INFO(first.dump());
    REQUIRE(first["success"] == true);
    REQUIRE(!first["function_calls"].empty());
    CHECK(ch.selection() == sel);
    CHECK(ch.render(other).rfind("<|im_end|>\n<|im_start|>user\n<tool_result>", 0) == 0);
    ch.complete(other, 4);
    CHECK(ch.selection() == sel);
    std::vector<uint32_t> turn;
    chat::encode_continuation(*m->tokenizer(), chat::marker_ids(*m->tokenizer()),
                              chat::render_later_turn(chat::TurnKind::ToolResults, other), turn);
    CHECK(ch.last_stats().prefill_tokens == turn.size());  // no rebuild
}

TEST_CASE("chat retrieval: the index file through needle_chat_create: written, reused, stale or damaged rebuilt") {
    api_test::Model model = api_test::load(api_test::model_path("tiny"));
    auto m = load_v2("tiny");
    const uint32_t dim = m->probe_head_dim(ProbeHead::Contrastive);
    REQUIRE(dim > 0);
    const std::string path = temp_path("chat");
    std::remove(path.c_str());
    const std::string tools = make_names(8);
    const needle_chat_params p = params_with_index(path.c_str());
    needle_chat *c = nullptr;
    REQUIRE(needle_chat_create(model.get(), "", tools.c_str(), &p, &c) == NEEDLE_OK);
    const std::vector<uint8_t> f1 = fixtures::read_bytes(path);
    CHECK(f1.size() == index_file_size(dim, 8));
    CHECK(std::string(f1.begin(), f1.begin() + 8) == "NDLTIDX1");
    const std::string r1 = c_render(c, "do task 21");
    needle_chat_free(c);
    // Reused: same selection, file untouched, nothing embedded again.
    c = nullptr;
    REQUIRE(needle_chat_create(model.get(), "", tools.c_str(), &p, &c) == NEEDLE_OK);
    CHECK(c_render(c, "do task 21") == r1);
    needle_chat_free(c);
    CHECK(fixtures::read_bytes(path) == f1);
    {
        chat::Chat ch(m, "", tools, opts(path));
        CHECK(ch.tool_index()->recomputed() == 0);
    }
    // Stale: one tool changed -> only it is embedded, the file lists the new set.
    const std::string changed = make_names(8, "_v2");
    {
        chat::Chat ch(m, "", changed, opts(path));
        CHECK(ch.tool_index()->recomputed() == 1);
    }
    CHECK(fixtures::read_bytes(path).size() == f1.size());
    CHECK(fixtures::read_bytes(path) != f1);
    // Damaged: a truncated file is rebuilt whole; a row that is not a unit vector is re-embedded.
    {
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(f1.data()), 100);
    }
    {
        chat::Chat ch(m, "", tools, opts(path));
        CHECK(ch.tool_index()->recomputed() == 8);
    }
    CHECK(fixtures::read_bytes(path) == f1);  // rewritten: the same bytes as the first build
    std::vector<uint8_t> bad = f1;
    const float nan = std::nanf("");
    std::memcpy(bad.data() + 52 + 32, &nan, 4);  // entry 0's first component
    {
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(bad.data()), bad.size());
    }
    {
        chat::Chat ch(m, "", tools, opts(path));
        CHECK(ch.tool_index()->recomputed() == 1);
    }
    CHECK(fixtures::read_bytes(path) == f1);
    // An older params layout (before tool_index_path) never reads the field.
    std::remove(path.c_str());
    needle_chat_params old = p;
    old.struct_size = offsetof(needle_chat_params, tool_index_path);
    c = nullptr;
    REQUIRE(needle_chat_create(model.get(), "", tools.c_str(), &old, &c) == NEEDLE_OK);
    needle_chat_free(c);
    CHECK(!exists(path));
    // An unwritable path is refused with a message (the caller asked for persistence).
    const needle_chat_params unwritable = params_with_index("/nonexistent-dir/tools.idx");
    c = reinterpret_cast<needle_chat *>(1);
    EXPECT_FAIL(NEEDLE_E_IO, needle_chat_create(model.get(), "", tools.c_str(), &unwritable, &c), "tool index");
    CHECK(c == nullptr);
    // The upstream call writes it too.
    const std::vector<uint8_t> blob = fixtures::read_bytes(api_test::model_path("tiny"));
    REQUIRE(needle_load(reinterpret_cast<const char *>(blob.data()), blob.size()) == 0);
    REQUIRE(needle_init("", tools.c_str(), path.c_str()) == 0);
    CHECK(fixtures::read_bytes(path) == f1);
    std::remove(path.c_str());
    REQUIRE(needle_init("", tools.c_str(), nullptr) == 0);
    CHECK(!exists(path));
}

TEST_CASE("chat retrieval: an index path that is a FIFO or a directory is refused at once, left in place") {
    api_test::Model model = api_test::load(api_test::model_path("tiny"));
    const std::string tools = make_names(8);
    const std::string fifo = temp_path("fifo");
    std::remove(fifo.c_str());
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const needle_chat_params p = params_with_index(fifo.c_str());
    // A blocking open of a FIFO waits for a writer: if create is not back within 10 s, a writer
    // opens and closes the FIFO to release it, so a regression fails here instead of hanging.
    std::atomic<bool> done{false};
    std::thread rescue([&] {
        const auto t0 = std::chrono::steady_clock::now();
        while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (done) return;
        const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (w >= 0) ::close(w);
    });
    const auto t0 = std::chrono::steady_clock::now();
    needle_chat *c = reinterpret_cast<needle_chat *>(1);
    EXPECT_FAIL(NEEDLE_E_IO, needle_chat_create(model.get(), "", tools.c_str(), &p, &c),
                "tool index: '" + fifo + "' is not a regular file");
    done = true;
    rescue.join();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK(c == nullptr);
    struct stat st;
    REQUIRE(::stat(fifo.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));  // not replaced by a rebuilt index
    std::remove(fifo.c_str());
    // A directory: the same refusal (it used to fail later, at the rename of the rebuilt file).
    const needle_chat_params dir = params_with_index("/tmp");
    c = reinterpret_cast<needle_chat *>(1);
    EXPECT_FAIL(NEEDLE_E_IO, needle_chat_create(model.get(), "", tools.c_str(), &dir, &c),
                "tool index: '/tmp' is not a regular file");
    CHECK(c == nullptr);
}

TEST_CASE("chat: huge tool lists are refused fast, before parsing, grammar or embedding") {
    api_test::Model tiny = api_test::load(api_test::model_path("tiny"));
    needle_chat_params p;
    p.struct_size = sizeof p;
    needle_chat_params_init(&p);
    needle_chat *c = nullptr;
    using clock = std::chrono::steady_clock;
    // 10 MB of tiny tools (~218,000): refused by the count, before any parsing.
    std::string huge = "[";
    for (int i = 0; huge.size() < (size_t(10) << 20); ++i)
        huge += "{\"name\":\"t" + std::to_string(i) + "\",\"description\":\"0123456789abcdef\"},";
    huge.back() = ']';
    auto t0 = clock::now();
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(tiny.get(), "", huge.c_str(), &p, &c), "at most 1024");
    double s = std::chrono::duration<double>(clock::now() - t0).count();
    MESSAGE("10 MB tools list refused in " << s << " s");
    CHECK(s < 2.0);
    // At the cap, without retrieval (no contrastive head): the whole block must fit: refused from
    // its byte count, before tokenising or compiling.
    api_test::Model odd = api_test::load(api_test::model_path("odd"));
    const std::string cap = make_names(int(chat::kMaxTools));
    t0 = clock::now();
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_chat_create(odd.get(), "", cap.c_str(), &p, &c), "static prefix");
    s = std::chrono::duration<double>(clock::now() - t0).count();
    MESSAGE("1024 tools without retrieval refused in " << s << " s");
    CHECK(s < 2.0);
    // With retrieval the five largest must fit: one tool longer than the context is refused
    // before any embedding.
    std::string lorem;
    for (int i = 0; i < 600; ++i) lorem += " lorem ipsum dolor";
    const std::string one_long = make_names(8, lorem);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_chat_create(tiny.get(), "", one_long.c_str(), &p, &c),
                "largest tools|selected tools");
    // The cap exactly, with retrieval on tiny: accepted in linear time (every tool embedded once).
    if (!fixtures::kSanitized) {
        t0 = clock::now();
        c = nullptr;
        REQUIRE(needle_chat_create(tiny.get(), "", cap.c_str(), &p, &c) == NEEDLE_OK);
        s = std::chrono::duration<double>(clock::now() - t0).count();
        MESSAGE("1024 tools with retrieval (embedded) created in " << s << " s");
        needle_chat_free(c);
    }
}
