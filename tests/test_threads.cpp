// Thread-safety contract of include/needle.h: one model serves any number of threads at once,
// each with its own state (and batch); a state may move between threads; states and batches keep
// a freed model alive, also when used from other threads; needle_last_error is per thread.
// Threads record what they saw and the main thread asserts (doctest assertions stay on one thread).
// scripts/sanitize.sh runs these under ThreadSanitizer.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

#if defined(__SANITIZE_THREAD__)
#include "core/parallel.h"
#endif

using namespace api_test;

namespace {

#if defined(__SANITIZE_THREAD__)
// Under ThreadSanitizer (scripts/sanitize.sh tsan) oneTBB runs without worker threads: libtbb is
// not instrumented, so TSan cannot see the synchronisation of its task hand-offs and would report
// every buffer a worker wrote and the caller read after the join (hundreds of false reports in
// our kernels). With one thread per arena each forward pass runs on its caller, so every report
// left is about what these tests are for: host threads sharing a model, states moving between
// threads, handle lifetimes and per-thread errors. The worker split itself is covered by the
// bit-identical n_threads tests (tests/test_fastpath.cpp). This object lives in the test binary
// and applies to the whole TSan process.
const needle::ThreadCap tsan_no_workers(1);
#endif

// Eight prompts of different lengths and content (some share a prefix, one is mostly bytes).
const std::vector<std::string> kPrompts = {
    "The quick brown fox jumps over the lazy dog.",
    "The quick brown fox",
    "Permission is hereby granted, free of charge, to any person obtaining a copy",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 caf\xC3\xA9",
    "a",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
    "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND",
};

// Everything one run of a prompt produces: the logits after a batched prefill of the prompt,
// then after each of `steps` greedy decode steps.
struct Run {
    std::vector<std::vector<float>> logits;
    std::vector<uint32_t> generated;
    needle_status status = NEEDLE_OK;
    std::string error;
};

// Runs a prompt on `s` (which must be at position 0); batch may be NULL. No doctest assertions.
Run run_prompt(needle_state *s, needle_batch *b, const std::vector<uint32_t> &ids, size_t V, int steps) {
    Run r;
    std::vector<float> lg(V);
    r.status = needle_state_prefill(s, b, ids.data(), ids.size(), lg.data(), V);
    if (r.status != NEEDLE_OK) {
        r.error = needle_last_error();
        return r;
    }
    r.logits.push_back(lg);
    for (int k = 0; k < steps; ++k) {
        const uint32_t next = argmax(lg);
        r.generated.push_back(next);
        r.status = needle_state_decode(s, next, lg.data(), V);
        if (r.status != NEEDLE_OK) {
            r.error = needle_last_error();
            return r;
        }
        r.logits.push_back(lg);
    }
    return r;
}

void check_same(const Run &got, const Run &want, const std::string &what) {
    CAPTURE(what);
    INFO("error: " << got.error);
    REQUIRE(got.status == NEEDLE_OK);
    REQUIRE(got.logits.size() == want.logits.size());
    size_t differing = 0;
    for (size_t i = 0; i < want.logits.size(); ++i) differing += same_bits(got.logits[i], want.logits[i]) ? 0 : 1;
    CHECK(differing == 0);
    CHECK(got.generated == want.generated);
}

// Releases all waiting threads at once, so their calls overlap as much as possible.
class StartLine {
public:
    explicit StartLine(int n) : left_(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lk(m_);
        if (--left_ == 0) cv_.notify_all();
        cv_.wait(lk, [&] { return left_ == 0; });
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int left_;
};

constexpr int kSteps = 6;

}  // namespace

TEST_CASE("threads: 8 threads decode different prompts on one model, bit-identical to one thread") {
    for (const std::string name : {"tiny", "odd"}) {
        CAPTURE(name);
        Model m = load(model_path(name));
        const size_t V = info_of(m.get()).vocab_size;
        std::vector<std::vector<uint32_t>> ids;
        for (const std::string &p : kPrompts) ids.push_back(tokenize(m.get(), p, true));
        // References, one prompt after another on this thread, one token at a time.
        std::vector<Run> want;
        for (const auto &p : ids) {
            State s = new_state(m.get());
            want.push_back(run_prompt(s.get(), nullptr, p, V, kSteps));
            REQUIRE(want.back().status == NEEDLE_OK);
        }
        // Every pair of prompts must differ, or "bit-identical" could hide a swapped result.
        for (size_t a = 0; a < want.size(); ++a)
            for (size_t b = a + 1; b < want.size(); ++b) CHECK_FALSE(same_bits(want[a].logits[0], want[b].logits[0]));

        const int n = int(kPrompts.size());
        std::vector<Run> got(size_t(n) * 3);
        StartLine start(n);
        std::vector<std::thread> threads;
        for (int t = 0; t < n; ++t) {
            threads.emplace_back([&, t] {
                needle_state *s = nullptr;
                needle_batch *b = nullptr;
                const bool ok = needle_state_create(m.get(), &s) == NEEDLE_OK &&
                                needle_batch_create(m.get(), 3 + uint32_t(t), &b) == NEEDLE_OK;
                start.arrive_and_wait();
                if (ok) {
                    const size_t i = size_t(t);
                    // Unbatched, then batched (chunks of 3 + t) and again after a reset: each
                    // must equal the one-thread run of the same prompt.
                    got[3 * i] = run_prompt(s, nullptr, ids[i], V, kSteps);
                    needle_state_reset(s);
                    got[3 * i + 1] = run_prompt(s, b, ids[i], V, kSteps);
                    needle_state_reset(s);
                    // Meanwhile the model's tokenizer serves this thread too.
                    const std::string text = kPrompts[i];
                    size_t nt = 0;
                    std::vector<uint32_t> again(ids[i].size() + 4);
                    if (needle_model_tokenize(m.get(), text.data(), text.size(), 1, again.data(), again.size(), &nt) !=
                            NEEDLE_OK ||
                        std::vector<uint32_t>(again.begin(), again.begin() + long(nt)) != ids[i]) {
                        got[3 * i + 2].status = NEEDLE_E_INTERNAL;
                        got[3 * i + 2].error = "tokenize differs";
                    } else {
                        got[3 * i + 2] = run_prompt(s, b, ids[i], V, kSteps);
                    }
                }
                needle_batch_free(b);
                needle_state_free(s);
            });
        }
        for (std::thread &th : threads) th.join();
        for (int t = 0; t < n; ++t) {
            CAPTURE(t);
            check_same(got[3 * size_t(t)], want[size_t(t)], "unbatched");
            check_same(got[3 * size_t(t) + 1], want[size_t(t)], "batched");
            check_same(got[3 * size_t(t) + 2], want[size_t(t)], "after reset");
        }
    }
}

TEST_CASE("threads: a state created on one thread is used on others") {
    Model m = load(model_path("tiny"));
    const size_t V = info_of(m.get()).vocab_size;
    const std::vector<uint32_t> ids = tokenize(m.get(), kPrompts[2], true);
    Run want;
    {
        State s = new_state(m.get());
        want = run_prompt(s.get(), nullptr, ids, V, kSteps);
        REQUIRE(want.status == NEEDLE_OK);
    }
    // Created on thread A, prefilled (batched) on thread B, decoded on threads C, D, ...
    needle_state *s = nullptr;
    needle_batch *b = nullptr;
    std::thread([&] {
        needle_state_create(m.get(), &s);
        needle_batch_create(m.get(), 4, &b);
    }).join();
    REQUIRE(s != nullptr);
    REQUIRE(b != nullptr);
    Run got;
    std::vector<float> lg(V);
    std::thread([&] {
        got.status = needle_state_prefill(s, b, ids.data(), ids.size(), lg.data(), V);
        got.logits.push_back(lg);
    }).join();
    REQUIRE(got.status == NEEDLE_OK);
    for (int k = 0; k < kSteps; ++k) {
        std::thread([&] {
            const uint32_t next = argmax(lg);
            got.generated.push_back(next);
            got.status = needle_state_decode(s, next, lg.data(), V);
            got.logits.push_back(lg);
        }).join();
        REQUIRE(got.status == NEEDLE_OK);
    }
    check_same(got, want, "moved between threads");
    CHECK(needle_state_pos(s) == ids.size() + kSteps);
    // Freed on yet another thread.
    std::thread([&] {
        needle_batch_free(b);
        needle_state_free(s);
    }).join();
}

TEST_CASE("threads: states keep a freed model alive and run from other threads") {
    const std::string path = model_path("odd");
    Model ref = load(path);
    const size_t V = info_of(ref.get()).vocab_size;
    std::vector<std::vector<uint32_t>> ids;
    std::vector<Run> want;
    for (int i = 0; i < 4; ++i) {
        ids.push_back(tokenize(ref.get(), kPrompts[size_t(i)], true));
        State s = new_state(ref.get());
        want.push_back(run_prompt(s.get(), nullptr, ids.back(), V, kSteps));
    }
    // Reference generation through needle_generate (it uses the model's tokenizer).
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 8;
    auto collect = [](uint32_t, const char *text, size_t len, void *user) {
        static_cast<std::string *>(user)->append(text, len);
        return 0;
    };
    std::string want_text;
    {
        State s = new_state(ref.get());
        REQUIRE(needle_generate(s.get(), nullptr, "Hello", 5, &gp, collect, &want_text, nullptr) == NEEDLE_OK);
    }

    needle_model *m = nullptr;
    REQUIRE(needle_model_load_file(path.c_str(), nullptr, &m) == NEEDLE_OK);
    std::vector<needle_state *> states(4, nullptr);
    std::vector<needle_batch *> batches(4, nullptr);
    for (int i = 0; i < 4; ++i) {
        REQUIRE(needle_state_create(m, &states[size_t(i)]) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 2, &batches[size_t(i)]) == NEEDLE_OK);
    }
    needle_state *gen_state = nullptr;
    REQUIRE(needle_state_create(m, &gen_state) == NEEDLE_OK);
    needle_model_free(m);  // only the states and batches hold it now
    m = nullptr;

    std::vector<Run> got(4);
    std::string got_text;
    needle_status gen_status = NEEDLE_E_INTERNAL;
    StartLine start(5);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
        threads.emplace_back([&, i] {
            start.arrive_and_wait();
            const size_t k = size_t(i);
            got[k] = run_prompt(states[k], batches[k], ids[k], V, kSteps);
            // The last thread to finish frees the last handles, and with them the model.
            needle_batch_free(batches[k]);
            needle_state_free(states[k]);
        });
    }
    threads.emplace_back([&] {
        start.arrive_and_wait();
        gen_status = needle_generate(gen_state, nullptr, "Hello", 5, &gp, collect, &got_text, nullptr);
        needle_state_free(gen_state);
    });
    for (std::thread &th : threads) th.join();
    for (int i = 0; i < 4; ++i) check_same(got[size_t(i)], want[size_t(i)], "after needle_model_free");
    CHECK(gen_status == NEEDLE_OK);
    CHECK(got_text == want_text);
}

TEST_CASE("threads: needle_last_error is per thread under concurrent failures") {
    Model m = load(model_path("odd"));
    const uint32_t V = info_of(m.get()).vocab_size;
    constexpr int kThreads = 6, kRounds = 300;
    std::vector<int> wrong(kThreads, 0);
    std::vector<std::string> last(kThreads);
    std::string quiet_before, quiet_after = "unset";
    StartLine start(kThreads + 1);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            needle_state *s = nullptr;
            const bool ok = needle_state_create(m.get(), &s) == NEEDLE_OK;
            start.arrive_and_wait();
            for (int r = 0; ok && r < kRounds; ++r) {
                // Each thread fails with its own token id (and, on odd rounds, its own batch
                // capacity), so its message names values no other thread uses.
                const uint32_t bad = V + uint32_t(t) * 1000 + uint32_t(r);
                std::string want_sub;
                needle_status st;
                if (r % 2 == 0) {
                    st = needle_state_decode(s, bad, nullptr, 0);
                    want_sub = std::to_string(bad);
                } else {
                    needle_batch *b = nullptr;
                    const uint32_t cap = 0x70000000u + uint32_t(t) * 1000 + uint32_t(r);
                    st = needle_batch_create(m.get(), cap, &b);
                    want_sub = std::to_string(cap);
                }
                const std::string msg = needle_last_error();
                if (st != NEEDLE_E_INVALID_ARGUMENT || msg.find(want_sub) == std::string::npos) ++wrong[size_t(t)];
                // A successful call on this thread leaves the message alone.
                if (needle_state_pos(s) != 0 || needle_last_error() != msg) ++wrong[size_t(t)];
                last[size_t(t)] = msg;
            }
            needle_state_free(s);
        });
    }
    // A thread that never fails keeps seeing "" while the others fail.
    threads.emplace_back([&] {
        quiet_before = needle_last_error();
        start.arrive_and_wait();
        needle_state *s = nullptr;
        std::vector<float> lg(V);
        for (int r = 0; r < 20; ++r) {
            if (needle_state_create(m.get(), &s) == NEEDLE_OK) {
                needle_state_decode(s, 2, lg.data(), V);
                needle_state_free(s);
            }
        }
        quiet_after = needle_last_error();
    });
    for (std::thread &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
        CAPTURE(t);
        CHECK(wrong[size_t(t)] == 0);
        CHECK(last[size_t(t)].find(std::to_string(0x70000000u + uint32_t(t) * 1000 + kRounds - 1)) != std::string::npos);
    }
    CHECK(quiet_before == "");
    CHECK(quiet_after == "");
}
