// Hardening round 2 (issue 13): n_threads of any size neither crashes nor makes oneTBB print,
// NEEDLE_FORCE_ISA refusals are visible without a print, a state is busy inside its own
// needle_generate callback, and messages count in the singular. Scenarios that need a fresh
// process (a crash, oneTBB's one-time warning, the ISA choice) run tests/api_probe.c as a child.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "api_util.h"
#include "child_util.h"

using namespace api_test;

namespace {

using child_test::ChildResult;

// tests/api_probe.c with `args` as a child; `env` as run_child takes it.
ChildResult run_probe(const std::vector<std::string> &args, const std::vector<std::string> &env = {}) {
    return child_test::run_child(NEEDLE_API_PROBE, args, env);
}

// The cores this process may run on (what n_threads 0 means and the clamp's bound).
int cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
    return CPU_COUNT(&set);
}

// What needle_model_info.n_threads reports for a request: clamped to the cores with oneTBB; 1 in a
// NEEDLE_WITH_TBB=OFF build, which runs each state on its caller.
int64_t effective(int64_t requested) {
#if NEEDLE_WITH_TBB
    const int64_t c = cores();
    return requested <= 0 ? c : std::min(requested, c);
#else
    (void)requested;
    return 1;
#endif
}

needle_model_info info_with_threads(const std::string &path, int32_t n_threads) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    Model m = load(path, &p);
    return info_of(m.get());
}

}  // namespace

TEST_CASE("hardening: n_threads 1, cores, cores+1, 1000 and INT32_MAX run in a child process") {
    const int c = cores();
    for (int64_t threads : {int64_t(1), int64_t(c), int64_t(c) + 1, int64_t(1000), int64_t(INT32_MAX)}) {
        INFO("n_threads " << threads << " on " << c << " cores");
        const ChildResult r = run_probe({"run", model_path("tiny"), std::to_string(threads), std::to_string(effective(threads))});
        INFO("probe output: " << r.output);
        CHECK(r.status == 0);  // 139 = SIGSEGV inside oneTBB before the clamp, 12 = wrong info.n_threads
        CHECK(r.output.empty());
    }
}

TEST_CASE("hardening: a model with n_threads N starts at most N - 1 threads, its load included") {
    // The load's rows-in-lanes copies ran on oneTBB's default arena: with n_threads 1 a worker
    // thread per other core was started at load and kept (1 -> 2 threads on 2 cores).
    for (int64_t threads : {int64_t(1), int64_t(2)}) {
        const ChildResult r = run_probe({"threads", model_path("needle2"), std::to_string(threads)});
        INFO("n_threads " << threads << ", threads before load / after it / after a prefill and a decode: " << r.output);
        REQUIRE(r.status == 0);
        int before = 0, loaded = 0, ran = 0;
        REQUIRE(std::sscanf(r.output.c_str(), "%d %d %d", &before, &loaded, &ran) == 3);
        REQUIRE(before >= 1);
        CHECK(loaded - before <= effective(threads) - 1);
        CHECK(ran - before <= effective(threads) - 1);
    }
}

TEST_CASE("hardening: the library writes nothing to fd 1 or 2 (threads above the cores, generate, free)") {
    // A fresh process each: oneTBB warns once per process, on the first oversized arena.
    const int c = cores();
    for (int64_t threads : {int64_t(c) + 1, int64_t(16), int64_t(0)}) {
        INFO("n_threads " << threads);
        // needle2 splits every matmul over the workers; tiny (batched prefill only) under ASan.
        const ChildResult r = run_probe({"run", model_path(fixtures::kSanitized ? "tiny" : "needle2"), std::to_string(threads),
                                         std::to_string(effective(threads))});
        CHECK(r.status == 0);
        INFO("bytes written: " << r.output);  // before: "TBB Warning: The number of workers is currently limited to 1..."
        CHECK(r.output.size() == 0);
    }
}

TEST_CASE("hardening: needle_model_info.n_threads reports the clamped count") {
    const int c = cores();
    for (int32_t threads : {0, 1, c, c + 1, INT32_MAX}) {
        CAPTURE(threads);
        CHECK(info_with_threads(model_path("tiny"), threads).n_threads == uint64_t(effective(threads)));
    }
#if NEEDLE_WITH_TBB
    CHECK(info_with_threads(model_path("tiny"), 0).n_threads == uint32_t(c));  // 0 = all cores
#endif
    // A caller of the shorter, older struct gets no n_threads written.
    {
        Model m = load(model_path("tiny"));
        needle_model_info info;
        std::memset(&info, 0xAB, sizeof info);
        info.struct_size = uint32_t(offsetof(needle_model_info, n_threads));
        REQUIRE(needle_model_get_info(m.get(), &info) == NEEDLE_OK);
        CHECK(info.n_threads == 0xABABABABu);
    }
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, [] {
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.n_threads = -1;
        needle_model *m = nullptr;
        return needle_model_load_file(model_path("tiny").c_str(), &p, &m);
    }(), "n_threads -1 is negative");
}

TEST_CASE("hardening: NEEDLE_FORCE_ISA that cannot be honoured falls back to the best ISA, visibly") {
    const ChildResult best = run_probe({"isa"}, {"NEEDLE_FORCE_ISA"});
    REQUIRE(best.status == 0);
    const std::string best_isa = best.output.substr(0, best.output.find(' '));
    CHECK(best.output == best_isa + " \n");  // nothing requested
    for (const char *refused : {"bogus", "AVX2", "neon_sve"}) {
        INFO("NEEDLE_FORCE_ISA=" << refused);
        const ChildResult r = run_probe({"isa"}, {std::string("NEEDLE_FORCE_ISA=") + refused});
        CHECK(r.status == 0);
        CHECK(r.output == best_isa + " " + refused + "\n");  // what runs, then the refused request
    }
    const ChildResult scalar = run_probe({"isa"}, {"NEEDLE_FORCE_ISA=scalar"});
    CHECK(scalar.output == "scalar scalar\n");  // honoured: the two agree
}

// ---------------------------------------------------------------- a state busy in needle_generate

namespace {
struct Reentry {
    needle_state *self;
    needle_state *other;
    uint32_t vocab;
    std::vector<needle_status> got;
    std::vector<std::string> messages;
    uint32_t pos_seen = 0;
    bool free_self = false;
};

int reenter(uint32_t token, const char *, size_t, void *user) {
    auto *r = static_cast<Reentry *>(user);
    if (token == NEEDLE_NO_TOKEN || !r->got.empty()) return 0;
    std::vector<float> lg(r->vocab);
    const uint32_t t = 5;
    auto note = [&](needle_status st) {
        r->got.push_back(st);
        r->messages.push_back(needle_last_error());
    };
    note(needle_state_decode(r->self, t, lg.data(), lg.size()));
    note(needle_state_prefill(r->self, nullptr, &t, 1, nullptr, 0));
    note(needle_generate(r->self, nullptr, "x", 1, nullptr, nullptr, nullptr, nullptr));
    r->pos_seen = needle_state_pos(r->self);
    needle_state_reset(r->self);  // ignored
    note(needle_state_decode(r->other, t, lg.data(), lg.size()));  // another state: fine
    if (r->free_self) needle_state_free(r->self);  // deferred until generate returns
    return 0;
}
}  // namespace

TEST_CASE("hardening: calls on a state from its own needle_generate callback are refused") {
    Model m = load(model_path("tiny"));
    const needle_model_info info = info_of(m.get());
    State s = new_state(m.get()), other = new_state(m.get()), ref = new_state(m.get());
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 6;
    needle_generate_result res;
    res.struct_size = sizeof res;

    Reentry r{s.get(), other.get(), info.vocab_size, {}, {}};
    REQUIRE(needle_generate(s.get(), nullptr, "Hello", 5, &gp, reenter, &r, &res) == NEEDLE_OK);
    REQUIRE(r.got.size() == 4);
    for (int i = 0; i < 3; ++i) {
        INFO("call " << i << ": " << r.messages[size_t(i)]);
        CHECK(r.got[size_t(i)] == NEEDLE_E_INVALID_ARGUMENT);
        CHECK(r.messages[size_t(i)].find("state is busy in needle_generate") != std::string::npos);
    }
    CHECK(r.messages[0].rfind("needle_state_decode: ", 0) == 0);
    CHECK(r.messages[2].rfind("needle_generate: ", 0) == 0);
    CHECK(r.got[3] == NEEDLE_OK);
    CHECK(needle_state_pos(other.get()) == 1u);

    // The sequence is exactly what an undisturbed generate leaves (before: the decode and prefill
    // were accepted and the state held two extra tokens, the reset rewound it).
    needle_generate_result ref_res;
    ref_res.struct_size = sizeof ref_res;
    REQUIRE(needle_generate(ref.get(), nullptr, "Hello", 5, &gp, nullptr, nullptr, &ref_res) == NEEDLE_OK);
    CHECK(res.generated_tokens == ref_res.generated_tokens);
    CHECK(needle_state_pos(s.get()) == needle_state_pos(ref.get()));
    CHECK(r.pos_seen == res.prompt_tokens);  // the prompt is fed; the first token is not yet
    // The state is usable again once generate returned.
    std::vector<float> lg(info.vocab_size);
    CHECK(needle_state_decode(s.get(), 5, lg.data(), lg.size()) == NEEDLE_OK);

    SUBCASE("needle_state_free from the callback is deferred to the end of needle_generate") {
        needle_state *victim = nullptr;
        REQUIRE(needle_state_create(m.get(), &victim) == NEEDLE_OK);
        Reentry f{victim, other.get(), info.vocab_size, {}, {}};
        f.free_self = true;
        CHECK(needle_generate(victim, nullptr, "Hello", 5, &gp, reenter, &f, nullptr) == NEEDLE_OK);
        CHECK(f.got.size() == 4);  // ASan run: no use after free inside generate, no leak after
    }
}

// ---------------------------------------------------------------- singular counts

TEST_CASE("hardening: messages say 1 token and 1 byte") {
    Model m = load(model_path("tiny"));
    const needle_model_info info = info_of(m.get());
    size_t n = 0;
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_model_tokenize(m.get(), "", 0, 1, nullptr, 0, &n),
                "needle_model_tokenize: 1 token does not fit capacity 0");
    char c = 0;
    const uint32_t byte_token = tokenize(m.get(), "a", false).at(0);
    const std::string one = detokenize(m.get(), {byte_token});
    REQUIRE(one.size() == 1);
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_model_detokenize(m.get(), &byte_token, 1, &c, 1, &n),
                    "needle_model_detokenize: 1 byte + NUL do not fit capacity 1");
    State s = new_state(m.get());
    std::vector<uint32_t> fill(info.max_seq_len - 1, 5u);
    REQUIRE(needle_state_prefill(s.get(), nullptr, fill.data(), fill.size(), nullptr, 0) == NEEDLE_OK);
    const uint32_t two[2] = {5, 5};
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, two, 2, nullptr, 0),
                "2 tokens at position");
    REQUIRE(needle_state_decode(s.get(), 5, nullptr, 0) == NEEDLE_OK);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), 5, nullptr, 0),
                "needle_state_decode: 1 token at position");
    needle_model *out = nullptr;
    const uint8_t one_byte = 0x83;
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_model_load_memory(&one_byte, 1, nullptr, &out),
                "not a .cact file (1 byte: 83)");
}
