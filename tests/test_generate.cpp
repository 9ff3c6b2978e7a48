// needle_generate through the C ABI: determinism per seed, greedy = argmax of the decode logits,
// streamed pieces (whole UTF-8, concatenating to detokenize), stops (callback, budget, context),
// continuation of a sequence, and parameter validation. Runs on the fixture models with the
// real 1024-piece SentencePiece tokenizer, and on the bundled demo model when it was built.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

// Strict UTF-8 (RFC 3629): no overlongs, no surrogates, nothing above U+10FFFF.
bool valid_utf8(const char *s, size_t n) {
    const auto *p = reinterpret_cast<const unsigned char *>(s);
    size_t i = 0;
    while (i < n) {
        const unsigned c = p[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) { ++i; continue; }
        if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; ++k) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

TEST_CASE("generate: the UTF-8 validator of these tests") {
    CHECK(valid_utf8("", 0));
    CHECK(valid_utf8("abc", 3));
    CHECK(valid_utf8("\xC3\xA9", 2));
    CHECK(valid_utf8("\xE6\x9D\xB1", 3));
    CHECK(valid_utf8("\xF0\x9F\x99\x82", 4));
    CHECK(valid_utf8("\xF4\x8F\xBF\xBF", 4));
    CHECK(valid_utf8("\xEF\xBF\xBD", 3));
    CHECK_FALSE(valid_utf8("\xC3", 1));
    CHECK_FALSE(valid_utf8("\xC0\xAF", 2));
    CHECK_FALSE(valid_utf8("\xE0\x80\xAF", 3));
    CHECK_FALSE(valid_utf8("\xED\xA0\x80", 3));
    CHECK_FALSE(valid_utf8("\xF4\x90\x80\x80", 4));
    CHECK_FALSE(valid_utf8("\x80", 1));
    CHECK_FALSE(valid_utf8("\xF0\x9F\x99", 3));
}

// Everything the callback saw.
struct Stream {
    std::vector<uint32_t> ids;       // generated tokens (not the flush)
    std::vector<std::string> pieces; // every piece, the flush included
    std::string text;
    int calls = 0, flushes = 0;
    bool calls_after_flush = false;
    bool all_utf8 = true, all_nul_terminated = true;
    int stop_at = -1;  // return non-zero on this (1-based) token
};

int collect(uint32_t token, const char *text, size_t text_len, void *user) {
    Stream &s = *static_cast<Stream *>(user);
    ++s.calls;
    if (s.flushes > 0) s.calls_after_flush = true;
    if (!text) {
        s.all_nul_terminated = false;
        return 1;
    }
    if (!valid_utf8(text, text_len)) s.all_utf8 = false;
    if (text[text_len] != '\0') s.all_nul_terminated = false;
    s.pieces.emplace_back(text, text_len);
    s.text.append(text, text_len);
    if (token == NEEDLE_NO_TOKEN) {
        ++s.flushes;
        return 0;
    }
    s.ids.push_back(token);
    return (s.stop_at > 0 && int(s.ids.size()) == s.stop_at) ? 1 : 0;
}

struct Run {
    needle_status status = -1;
    needle_generate_result result{};
    Stream stream;
    uint32_t pos = 0;
};

needle_generate_result garbage_result() {
    needle_generate_result r;
    std::memset(&r, 0xCD, sizeof r);
    r.struct_size = sizeof r;
    return r;
}

// A failed call with a valid result struct reports that nothing was generated (NEEDLE_STOP_NONE).
void check_no_generation(const needle_generate_result &r) {
    CHECK(r.struct_size == sizeof r);
    CHECK(r.stop_reason == NEEDLE_STOP_NONE);
    CHECK(r.prompt_tokens == 0);
    CHECK(r.generated_tokens == 0);
    CHECK(r.prefill_ms == 0.0);
    CHECK(r.decode_ms == 0.0);
}

needle_generate_params sampling(uint64_t seed, uint32_t max_tokens) {
    needle_generate_params p;
    p.struct_size = sizeof p;
    needle_generate_params_init(&p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.9f;
    p.seed = seed;
    p.max_tokens = max_tokens;
    return p;
}

needle_generate_params greedy(uint32_t max_tokens) {
    needle_generate_params p;
    p.struct_size = sizeof p;
    needle_generate_params_init(&p);
    p.max_tokens = max_tokens;
    return p;
}

Run generate(needle_state *s, needle_batch *b, const std::string &prompt, const needle_generate_params &p,
             int stop_at = -1) {
    Run r;
    r.stream.stop_at = stop_at;
    std::memset(&r.result, 0xCD, sizeof r.result);
    r.result.struct_size = sizeof r.result;
    r.status = needle_generate(s, b, prompt.data(), prompt.size(), &p, collect, &r.stream, &r.result);
    INFO("needle_generate: " << r.status << " " << needle_last_error());
    REQUIRE((r.status == NEEDLE_OK || r.status == NEEDLE_E_CANCELLED));
    r.pos = needle_state_pos(s);
    return r;
}

// Checks shared by every successful run: counts, positions, pieces.
void check_stream(needle_model *m, const Run &r, uint32_t pos_before) {
    const Stream &st = r.stream;
    CHECK(r.result.struct_size == sizeof r.result);
    CHECK(r.result.generated_tokens == st.ids.size());
    CHECK(st.all_utf8);
    CHECK(st.all_nul_terminated);
    CHECK(st.flushes <= 1);
    CHECK_FALSE(st.calls_after_flush);
    CHECK(st.calls == int(st.ids.size()) + st.flushes);
    // Each token but the stop token is fed: the state holds prompt + streamed tokens.
    CHECK(r.pos == pos_before + r.result.prompt_tokens + r.result.generated_tokens);
    CHECK(r.result.prefill_ms >= 0.0);
    CHECK(r.result.decode_ms >= 0.0);
    CHECK(std::isfinite(r.result.prefill_ms));
    CHECK(std::isfinite(r.result.decode_ms));
    CHECK(r.result.stop_reason >= NEEDLE_STOP_EOS);
    CHECK(r.result.stop_reason <= NEEDLE_STOP_CALLBACK);
    const needle_model_info info = info_of(m);
    const uint32_t eos = info.eos_id;
    for (uint32_t id : st.ids) {
        CHECK(id < info.vocab_size);
        CHECK(id != eos);
    }
    // The pieces concatenate exactly to detokenize() of the streamed ids.
    CHECK(st.text == detokenize(m, st.ids));
}

// The greedy continuation computed by hand with needle_state_prefill / needle_state_decode.
std::vector<uint32_t> manual_greedy(needle_model *m, needle_state *s, const std::vector<uint32_t> &feed,
                                    uint32_t max_tokens, uint32_t *stop_reason) {
    const needle_model_info info = info_of(m);
    const size_t V = info.vocab_size;
    // "<|im_end|>" encodes as [U+2581 (the dummy prefix), <|im_end|>].
    const std::vector<uint32_t> im_end_ids = tokenize(m, "<|im_end|>", false);
    REQUIRE(!im_end_ids.empty());
    REQUIRE(detokenize(m, {im_end_ids.back()}) == "<|im_end|>");
    const std::vector<uint32_t> im_end{im_end_ids.back()};
    std::vector<float> lg = prefill(s, nullptr, feed, V);
    std::vector<uint32_t> out;
    *stop_reason = NEEDLE_STOP_MAX_TOKENS;
    while (out.size() < max_tokens) {
        const uint32_t id = argmax(lg);
        if (id == info.eos_id || id == im_end[0]) {
            *stop_reason = NEEDLE_STOP_EOS;
            break;
        }
        out.push_back(id);
        if (needle_state_pos(s) == info.max_seq_len - 1) {  // feeding it fills the context
            REQUIRE(needle_state_decode(s, id, nullptr, 0) == NEEDLE_OK);
            if (out.size() < max_tokens) *stop_reason = NEEDLE_STOP_CONTEXT_FULL;
            break;
        }
        lg = step(s, id, V);
    }
    return out;
}

std::vector<uint32_t> concat(std::vector<uint32_t> a, const std::vector<uint32_t> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

const char *kPrompts[] = {
    "The quick brown fox",
    "<|im_start|>user\nset a timer for ten minutes<|im_end|>\n<|im_start|>assistant\n",
    "Café crème, naïve façade — 東京で会いましょう 🙂",
};

// ---------------------------------------------------------------- the checks, per model

void check_seed_determinism(needle_model *m) {
    for (const std::string prompt : kPrompts) {
        CAPTURE(prompt);
        State s = new_state(m);
        const Run a = generate(s.get(), nullptr, prompt, sampling(42, 24));
        check_stream(m, a, 0);
        needle_state_reset(s.get());
        const Run b = generate(s.get(), nullptr, prompt, sampling(42, 24));
        CHECK(a.stream.ids == b.stream.ids);
        CHECK(a.stream.text == b.stream.text);
        CHECK(a.stream.pieces == b.stream.pieces);
        CHECK(a.result.stop_reason == b.result.stop_reason);
        CHECK(a.pos == b.pos);
        // A batched prompt pass gives the same bits, hence the same draws.
        Batch bt = new_batch(m, 5);
        State s2 = new_state(m);
        const Run c = generate(s2.get(), bt.get(), prompt, sampling(42, 24));
        CHECK(a.stream.ids == c.stream.ids);

        // Other seeds: at least one run differs.
        int differ = 0;
        for (uint64_t seed : {1ull, 2ull, 3ull, 4ull, 0xFFFFFFFFFFFFFFFFull}) {
            needle_state_reset(s.get());
            const Run o = generate(s.get(), nullptr, prompt, sampling(seed, 24));
            check_stream(m, o, 0);
            if (o.stream.ids != a.stream.ids) ++differ;
        }
        CHECK(differ >= 1);
    }
}

void check_greedy_is_argmax(needle_model *m) {
    const needle_model_info info = info_of(m);
    for (const std::string prompt : kPrompts) {
        CAPTURE(prompt);
        const std::vector<uint32_t> pids = tokenize(m, prompt, true);
        State g = new_state(m);
        const Run r = generate(g.get(), nullptr, prompt, greedy(20));
        CHECK(r.status == NEEDLE_OK);
        check_stream(m, r, 0);
        CHECK(r.result.prompt_tokens == pids.size());

        State man = new_state(m);
        uint32_t reason = 0;
        const std::vector<uint32_t> want = manual_greedy(m, man.get(), pids, 20, &reason);
        CHECK(r.stream.ids == want);
        CHECK(r.result.stop_reason == reason);
        CHECK(r.pos == needle_state_pos(man.get()));
        // Both states hold the same sequence: the same next logits, bit for bit.
        CHECK(same_bits(step(g.get(), 100, info.vocab_size), step(man.get(), 100, info.vocab_size)));

        // NULL params = defaults (greedy, 128 tokens); NULL callback and result are fine.
        State d = new_state(m);
        REQUIRE(needle_generate(d.get(), nullptr, prompt.data(), prompt.size(), nullptr, nullptr, nullptr, nullptr) ==
                NEEDLE_OK);
        State d2 = new_state(m);
        const Run r2 = generate(d2.get(), nullptr, prompt, greedy(128));
        CHECK(needle_state_pos(d.get()) == r2.pos);
        State man2 = new_state(m);
        CHECK(r2.stream.ids == manual_greedy(m, man2.get(), pids, 128, &reason));
        CHECK(r2.result.stop_reason == reason);
    }
}

void check_pieces(needle_model *m) {
    // High temperature, no truncation: many byte-fallback tokens, so pieces split characters.
    int with_bytes = 0, empty_pieces = 0, flushes = 0, split_runs = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        CAPTURE(seed);
        needle_generate_params p;
        p.struct_size = sizeof p;
        needle_generate_params_init(&p);
        p.temperature = 1.5f;
        p.seed = seed;
        p.max_tokens = 48;
        State s = new_state(m);
        const Run r = generate(s.get(), nullptr, kPrompts[2], p);
        check_stream(m, r, 0);
        for (uint32_t id : r.stream.ids)
            if (id >= 14 && id < 270) {
                ++with_bytes;
                break;
            }
        for (size_t i = 0; i < r.stream.ids.size(); ++i) empty_pieces += r.stream.pieces[i].empty();
        flushes += r.stream.flushes;
        // Ending right after a token that only starts a character (by budget or by the callback):
        // one last NEEDLE_NO_TOKEN call delivers U+FFFD, and the text still equals detokenize().
        // The first k where the streamed text lags detokenize() of the first k ids (pending bytes).
        uint32_t k = 0;
        std::string streamed;
        for (size_t i = 0; i < r.stream.ids.size() && k == 0; ++i) {
            streamed += r.stream.pieces[i];
            const std::vector<uint32_t> head(r.stream.ids.begin(), r.stream.ids.begin() + long(i) + 1);
            if (detokenize(m, head) != streamed) k = uint32_t(i) + 1;
        }
        if (k > 0) {
            CAPTURE(k);
            needle_generate_params pb = p;
            pb.max_tokens = k;
            State sb = new_state(m), sc = new_state(m);
            const Run byb = generate(sb.get(), nullptr, kPrompts[2], pb);
            const Run byc = generate(sc.get(), nullptr, kPrompts[2], p, int(k));
            for (const Run *e : {&byb, &byc}) {
                check_stream(m, *e, 0);
                CHECK(e->stream.ids == std::vector<uint32_t>(r.stream.ids.begin(), r.stream.ids.begin() + k));
                CHECK(e->stream.flushes == 1);
                REQUIRE(!e->stream.pieces.empty());
                CHECK(e->stream.pieces.back().find("\xEF\xBF\xBD") != std::string::npos);
            }
            CHECK(byb.result.stop_reason == NEEDLE_STOP_MAX_TOKENS);
            CHECK(byc.result.stop_reason == NEEDLE_STOP_CALLBACK);
            ++split_runs;
        }
        // Every generated token got exactly one call, in order.
        CHECK(r.stream.pieces.size() == r.stream.ids.size() + size_t(r.stream.flushes));
    }
    MESSAGE("runs with byte tokens: " << with_bytes << " of 6; empty pieces: " << empty_pieces
                                      << "; U+FFFD flushes: " << flushes << "; runs cut inside a character: "
                                      << split_runs);
    WARN(split_runs > 0);  // the flush path was exercised
}

void check_callback_stop(needle_model *m) {
    const needle_model_info info = info_of(m);
    const std::string prompt = kPrompts[0];
    const std::vector<uint32_t> pids = tokenize(m, prompt, true);
    for (int stop_at : {1, 3}) {
        CAPTURE(stop_at);
        State s = new_state(m);
        const Run r = generate(s.get(), nullptr, prompt, sampling(9, 50), stop_at);
        CHECK(r.status == NEEDLE_E_CANCELLED);
        CHECK(r.result.stop_reason == NEEDLE_STOP_CALLBACK);
        CHECK(r.result.generated_tokens == uint32_t(stop_at));
        CHECK(r.stream.ids.size() == size_t(stop_at));
        CHECK(mentions(needle_last_error(), "callback|cancel"));
        check_stream(m, r, 0);
        CHECK(r.pos == pids.size() + size_t(stop_at));
        // The state holds exactly prompt + streamed tokens.
        State ref = new_state(m);
        REQUIRE(needle_state_prefill(ref.get(), nullptr, pids.data(), pids.size(), nullptr, 0) == NEEDLE_OK);
        REQUIRE(needle_state_prefill(ref.get(), nullptr, r.stream.ids.data(), r.stream.ids.size(), nullptr, 0) ==
                NEEDLE_OK);
        CHECK(same_bits(step(s.get(), 77, info.vocab_size), step(ref.get(), 77, info.vocab_size)));
        // The same seed without the stop streams the same first tokens.
        State s2 = new_state(m);
        const Run full = generate(s2.get(), nullptr, prompt, sampling(9, 50));
        REQUIRE(full.stream.ids.size() >= size_t(stop_at));
        CHECK(std::vector<uint32_t>(full.stream.ids.begin(), full.stream.ids.begin() + stop_at) == r.stream.ids);
    }
}

void check_budget(needle_model *m) {
    const std::vector<uint32_t> pids = tokenize(m, kPrompts[0], true);
    for (uint32_t budget : {0u, 1u, 5u}) {
        CAPTURE(budget);
        State s = new_state(m);
        const Run r = generate(s.get(), nullptr, kPrompts[0], sampling(5, budget));
        CHECK(r.status == NEEDLE_OK);
        // A stop on EOS before the budget is the only other legal outcome.
        if (r.result.stop_reason == NEEDLE_STOP_MAX_TOKENS) {
            CHECK(r.result.generated_tokens == budget);
        } else {
            CHECK(r.result.stop_reason == NEEDLE_STOP_EOS);
            CHECK(r.result.generated_tokens < budget);
        }
        CHECK(r.pos == pids.size() + r.result.generated_tokens);
        check_stream(m, r, 0);
    }
    // Greedy with a budget below the greedy run's length: exactly the budget.
    State s = new_state(m);
    State man = new_state(m);
    uint32_t reason = 0;
    const std::vector<uint32_t> g = manual_greedy(m, man.get(), pids, 6, &reason);
    const Run r = generate(s.get(), nullptr, kPrompts[0], greedy(6));
    CHECK(r.result.stop_reason == reason);
    CHECK(r.stream.ids == g);
    if (reason == NEEDLE_STOP_MAX_TOKENS) CHECK(r.result.generated_tokens == 6);
}

void check_context(needle_model *m) {
    const needle_model_info info = info_of(m);
    const size_t V = info.vocab_size;
    const uint32_t T = info.max_seq_len;
    const std::string prompt = " and then some more words to say here";
    const std::vector<uint32_t> pids = tokenize(m, prompt, false);  // fed at pos > 0: no BOS
    REQUIRE(pids.size() >= 3);
    std::vector<uint32_t> filler(T);
    for (uint32_t i = 0; i < T; ++i) filler[i] = 300 + (i * 37) % 600;
    filler[0] = info.bos_id;

    // The prompt does not fit with room for one token: CONTEXT_FULL, nothing fed.
    for (uint32_t room : {uint32_t(pids.size()), uint32_t(pids.size() - 1), 0u}) {
        CAPTURE(room);
        State s = new_state(m);
        const uint32_t start = T - room;
        REQUIRE(needle_state_prefill(s.get(), nullptr, filler.data(), start, nullptr, 0) == NEEDLE_OK);
        Stream st;
        needle_generate_result res;
        std::memset(&res, 0xCD, sizeof res);
        res.struct_size = sizeof res;
        const needle_generate_params p = greedy(10);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL,
                    needle_generate(s.get(), nullptr, prompt.data(), prompt.size(), &p, collect, &st, &res),
                    std::to_string(T).c_str());
        CHECK(st.calls == 0);
        check_no_generation(res);
        CHECK(needle_state_pos(s.get()) == start);
        // Arguments are checked before room.
        needle_generate_params bad = p;
        bad.temperature = -1.0f;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT,
                    needle_generate(s.get(), nullptr, prompt.data(), prompt.size(), &bad, collect, &st, &res),
                    "temperature");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, "ab\xC3", 3, &p, collect, &st, &res),
                    "UTF-8|utf8");
        CHECK(st.calls == 0);
        CHECK(needle_state_pos(s.get()) == start);
        const std::vector<uint32_t> fed(filler.begin(), filler.begin() + start);
        if (start < T) {
            State ref = new_state(m);
            REQUIRE(needle_state_prefill(ref.get(), nullptr, fed.data(), fed.size(), nullptr, 0) == NEEDLE_OK);
            CHECK(same_bits(step(s.get(), 55, V), step(ref.get(), 55, V)));
        }
    }
    // Exactly one token of room after the prompt: one token, then CONTEXT_FULL (or EOS first).
    {
        State s = new_state(m);
        const uint32_t start = T - uint32_t(pids.size()) - 1;
        REQUIRE(needle_state_prefill(s.get(), nullptr, filler.data(), start, nullptr, 0) == NEEDLE_OK);
        const Run r = generate(s.get(), nullptr, prompt, greedy(10));
        State man = new_state(m);
        REQUIRE(needle_state_prefill(man.get(), nullptr, filler.data(), start, nullptr, 0) == NEEDLE_OK);
        uint32_t reason = 0;
        const std::vector<uint32_t> want = manual_greedy(m, man.get(), pids, 10, &reason);
        CHECK(r.status == NEEDLE_OK);
        CHECK(r.stream.ids == want);
        CHECK(r.result.stop_reason == reason);
        CHECK(r.result.prompt_tokens == pids.size());
        if (reason == NEEDLE_STOP_CONTEXT_FULL) {
            CHECK(r.result.generated_tokens == 1);
            CHECK(r.pos == T);
        }
        check_stream(m, r, start);
    }
    // Room for more: the run reaches max_seq_len and stops there.
    {
        State s = new_state(m);
        const uint32_t start = T - uint32_t(pids.size()) - 4;
        REQUIRE(needle_state_prefill(s.get(), nullptr, filler.data(), start, nullptr, 0) == NEEDLE_OK);
        const Run r = generate(s.get(), nullptr, prompt, sampling(3, 100));
        if (r.result.stop_reason != NEEDLE_STOP_EOS) {
            CHECK(r.result.stop_reason == NEEDLE_STOP_CONTEXT_FULL);
            CHECK(r.result.generated_tokens == 4);
            CHECK(r.pos == T);
        }
        check_stream(m, r, start);
    }
}

void check_continuation(needle_model *m) {
    const needle_model_info info = info_of(m);
    const std::string a = "The quick brown fox", b = " jumps over the lazy dog";
    State s = new_state(m);
    const Run r1 = generate(s.get(), nullptr, a, greedy(4));
    check_stream(m, r1, 0);
    const Run r2 = generate(s.get(), nullptr, b, greedy(5));
    check_stream(m, r2, r1.pos);
    const std::vector<uint32_t> ta = tokenize(m, a, true), tb = tokenize(m, b, false);
    CHECK(r1.result.prompt_tokens == ta.size());
    CHECK(r2.result.prompt_tokens == tb.size());  // no BOS in the middle of a sequence
    CHECK(r2.pos > r1.pos);
    CHECK(r2.pos == r1.pos + tb.size() + r2.result.generated_tokens);

    // By hand: BOS + a, greedy, then b (no BOS), greedy.
    State man = new_state(m);
    uint32_t reason = 0;
    const std::vector<uint32_t> g1 = manual_greedy(m, man.get(), ta, 4, &reason);
    CHECK(r1.stream.ids == g1);
    if (reason == NEEDLE_STOP_EOS) return;  // the EOS is not fed: the sequences diverge here
    const std::vector<uint32_t> g2 = manual_greedy(m, man.get(), tb, 5, &reason);
    CHECK(r2.stream.ids == g2);
    CHECK(r2.result.stop_reason == reason);
    CHECK(same_bits(step(s.get(), 9, info.vocab_size), step(man.get(), 9, info.vocab_size)));

    // add_bos 0 at position 0: no BOS.
    State nb = new_state(m);
    needle_generate_params p = greedy(2);
    p.add_bos = 0;
    Run r3;
    r3.result.struct_size = sizeof r3.result;
    REQUIRE(needle_generate(nb.get(), nullptr, a.data(), a.size(), &p, collect, &r3.stream, &r3.result) == NEEDLE_OK);
    CHECK(r3.result.prompt_tokens == ta.size() - 1);
    // An empty prompt with BOS at position 0 feeds just BOS.
    State eb = new_state(m);
    Run r4;
    r4.result.struct_size = sizeof r4.result;
    const needle_generate_params p4 = greedy(3);
    REQUIRE(needle_generate(eb.get(), nullptr, "", 0, &p4, collect, &r4.stream, &r4.result) == NEEDLE_OK);
    CHECK(r4.result.prompt_tokens == 1);
    CHECK(needle_state_pos(eb.get()) == 1 + r4.result.generated_tokens);
    // Nothing to feed: empty prompt without BOS, or empty prompt mid-sequence.
    const size_t before = needle_state_pos(eb.get());
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(eb.get(), nullptr, "", 0, &p4, nullptr, nullptr, nullptr),
                "empty|nothing");
    CHECK(needle_state_pos(eb.get()) == before);
    State e0 = new_state(m);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(e0.get(), nullptr, nullptr, 0, &p, nullptr, nullptr, nullptr),
                "empty|nothing");
    CHECK(needle_state_pos(e0.get()) == 0);
}

void check_bad_params(needle_model *m, needle_model *other) {
    State s = new_state(m);
    const std::vector<uint32_t> pids = tokenize(m, "Hello there", true);
    REQUIRE(needle_state_prefill(s.get(), nullptr, pids.data(), pids.size(), nullptr, 0) == NEEDLE_OK);
    const uint32_t pos = needle_state_pos(s.get());
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();

    struct Bad {
        const char *what;
        needle_generate_params p;
    };
    std::vector<Bad> bad;
    auto add = [&](const char *what, auto edit) {
        needle_generate_params p = sampling(1, 8);
        edit(p);
        bad.push_back({what, p});
    };
    add("temperature", [](needle_generate_params &p) { p.temperature = -1.0f; });
    add("temperature", [&](needle_generate_params &p) { p.temperature = nan; });
    add("temperature", [&](needle_generate_params &p) { p.temperature = inf; });
    add("temperature", [&](needle_generate_params &p) { p.temperature = -0.0001f; });
    add("top_p", [](needle_generate_params &p) { p.top_p = 0.0f; });
    add("top_p", [](needle_generate_params &p) { p.top_p = 1.5f; });
    add("top_p", [](needle_generate_params &p) { p.top_p = -0.5f; });
    add("top_p", [&](needle_generate_params &p) { p.top_p = nan; });
    add("top_k", [](needle_generate_params &p) { p.top_k = -1; });
    add("top_k", [](needle_generate_params &p) { p.top_k = INT32_MIN; });
    add("struct_size", [](needle_generate_params &p) { p.struct_size = 4; });
    add("struct_size", [](needle_generate_params &p) { p.struct_size = 0; });
    for (const Bad &b : bad) {
        CAPTURE(b.what);
        Stream st;
        needle_generate_result res;
        std::memset(&res, 0xCD, sizeof res);
        res.struct_size = sizeof res;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, "Hi", 2, &b.p, collect, &st, &res),
                    b.what);
        CHECK(st.calls == 0);
        CHECK(needle_state_pos(s.get()) == pos);
        check_no_generation(res);
    }
    // Valid extremes are accepted.
    for (auto edit : {+[](needle_generate_params &p) { p.top_p = 1.0f; }, +[](needle_generate_params &p) { p.top_k = 1; },
                      +[](needle_generate_params &p) { p.top_k = 1 << 30; },
                      +[](needle_generate_params &p) { p.top_p = 1e-6f; },
                      +[](needle_generate_params &p) { p.temperature = 1e-6f; }}) {
        needle_generate_params p = sampling(1, 2);
        edit(p);
        State t = new_state(m);
        CHECK(needle_generate(t.get(), nullptr, "Hi", 2, &p, nullptr, nullptr, nullptr) == NEEDLE_OK);
    }
    // top_k 1 and a tiny top_p are greedy whatever the seed.
    {
        State g = new_state(m), k1 = new_state(m), p0 = new_state(m);
        const Run rg = generate(g.get(), nullptr, kPrompts[0], greedy(8));
        needle_generate_params pk = sampling(77, 8);
        pk.top_k = 1;
        const Run rk = generate(k1.get(), nullptr, kPrompts[0], pk);
        needle_generate_params pp = sampling(78, 8);
        pp.top_p = 1e-6f;
        pp.top_k = 0;
        const Run rp = generate(p0.get(), nullptr, kPrompts[0], pp);
        CHECK(rk.stream.ids == rg.stream.ids);
        CHECK(rp.stream.ids == rg.stream.ids);
    }

    // result.struct_size too small.
    {
        const needle_generate_params p = sampling(1, 8);
        for (uint32_t small : {0u, 4u, uint32_t(sizeof(needle_generate_result) - 8)}) {
            CAPTURE(small);
            needle_generate_result res;
            std::memset(&res, 0xCD, sizeof res);
            res.struct_size = small;
            const needle_generate_result before = res;
            Stream st;
            EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, "Hi", 2, &p, collect, &st, &res),
                        "struct_size");
            CHECK(std::memcmp(&res, &before, sizeof res) == 0);  // too small to be written
            CHECK(st.calls == 0);
            CHECK(needle_state_pos(s.get()) == pos);
        }
    }
    // Invalid UTF-8 prompt.
    {
        const needle_generate_params p = sampling(1, 8);
        Stream st;
        needle_generate_result res = garbage_result();
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, "ab\xC3", 3, &p, collect, &st, &res),
                    "UTF-8|utf8");
        CHECK(st.calls == 0);
        CHECK(needle_state_pos(s.get()) == pos);
        check_no_generation(res);
        // NULL state, NULL prompt with a length.
        res = garbage_result();
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(nullptr, nullptr, "Hi", 2, &p, collect, &st, &res), "state");
        check_no_generation(res);
        res = garbage_result();
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, nullptr, 2, &p, collect, &st, &res),
                    "prompt");
        check_no_generation(res);
        CHECK(st.calls == 0);
    }
    // A batch of another model.
    {
        Batch ob = new_batch(other, 4);
        const needle_generate_params p = sampling(1, 8);
        Stream st;
        needle_generate_result res = garbage_result();
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), ob.get(), "Hi", 2, &p, collect, &st, &res),
                    "batch");
        CHECK(st.calls == 0);
        CHECK(needle_state_pos(s.get()) == pos);
        check_no_generation(res);
    }
    // Still the same state.
    State ref = new_state(m);
    REQUIRE(needle_state_prefill(ref.get(), nullptr, pids.data(), pids.size(), nullptr, 0) == NEEDLE_OK);
    const size_t V = info_of(m).vocab_size;
    CHECK(same_bits(step(s.get(), 42, V), step(ref.get(), 42, V)));
}

void check_all(needle_model *m, needle_model *other) {
    SUBCASE("seed determinism") { check_seed_determinism(m); }
    SUBCASE("greedy is argmax") { check_greedy_is_argmax(m); }
    SUBCASE("pieces") { check_pieces(m); }
    SUBCASE("callback stop") { check_callback_stop(m); }
    SUBCASE("budget") { check_budget(m); }
    SUBCASE("context") { check_context(m); }
    SUBCASE("continuation") { check_continuation(m); }
    SUBCASE("bad parameters") { check_bad_params(m, other); }
}

}  // namespace

// A state created with max_tokens holds that many positions (its KV memory is sized for them):
// needle_generate stops there as needle_state_decode refuses to go past it. It used the model's
// max_seq_len, and on Needle 3 wrote past the state's caches (SIGSEGV in qk_store).
void check_state_max_tokens(needle_model *m) {
    const needle_model_info info = info_of(m);
    const uint32_t cap = 8;
    REQUIRE(info.max_seq_len > 4 * cap);
    needle_state_params sp = state_params();
    sp.max_tokens = cap;
    State s = new_state(m, sp);
    const std::string prompt = "Hi";
    const std::vector<uint32_t> pids = tokenize(m, prompt, true);
    REQUIRE(pids.size() + 1 < cap);
    const Run r = generate(s.get(), nullptr, prompt, greedy(100));
    CHECK(r.status == NEEDLE_OK);
    CHECK(r.pos <= cap);
    CHECK(r.result.prompt_tokens == pids.size());
    CHECK(r.pos == r.result.prompt_tokens + r.result.generated_tokens);
    if (r.result.stop_reason != NEEDLE_STOP_EOS) {
        CHECK(r.result.stop_reason == NEEDLE_STOP_CONTEXT_FULL);
        CHECK(r.pos == cap);
    }
    // The same tokens as decoding by hand within the cap.
    State man = new_state(m, sp);
    std::vector<float> lg = prefill(man.get(), nullptr, pids, info.vocab_size);
    for (size_t i = 0; i < r.stream.ids.size(); ++i) {
        CHECK(r.stream.ids[i] == argmax(lg));
        if (needle_state_pos(man.get()) < cap)
            REQUIRE(needle_state_decode(man.get(), r.stream.ids[i], lg.data(), lg.size()) == NEEDLE_OK);
    }
    // A full state, and a prompt longer than the cap: CONTEXT_FULL naming max_tokens, nothing fed.
    needle_generate_result res = garbage_result();
    Stream st;
    const needle_generate_params p = greedy(10);
    if (r.pos == cap) {
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_generate(s.get(), nullptr, "Hi", 2, &p, collect, &st, &res),
                    "max_tokens 8");
        CHECK(needle_state_pos(s.get()) == cap);
        check_no_generation(res);
    }
    needle_state_reset(s.get());
    const std::string longer = "one two three four five six seven eight nine ten eleven twelve";
    REQUIRE(tokenize(m, longer, true).size() >= cap);
    res = garbage_result();
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL,
                needle_generate(s.get(), nullptr, longer.data(), longer.size(), &p, collect, &st, &res), "max_tokens 8");
    CHECK(st.calls == 0);
    CHECK(needle_state_pos(s.get()) == 0);
    check_no_generation(res);
}

TEST_CASE("generate: a state's max_tokens bounds generation (tiny v2, tiny3 v3)") {
    for (const std::string &path : {model_path("tiny"), fixtures::v3("models/tiny3.cact")}) {
        CAPTURE(path);
        Model m = load(path);
        if (!info_of(m.get()).has_tokenizer) continue;
        check_state_max_tokens(m.get());
    }
}

TEST_CASE("generate: odd") {
    Model m = load(model_path("odd"));
    Model other = load(model_path("tiny"));
    check_all(m.get(), other.get());
}

TEST_CASE("generate: tiny") {
    Model m = load(model_path("tiny"));
    Model other = load(model_path("odd"));
    check_all(m.get(), other.get());
}

// The demo preset with random weights (the trained demo model is too sure of itself for the
// seed checks: its sampled runs coincide).
TEST_CASE("generate: demo model") {
    const std::string demo = NEEDLE_RANDOM_MODEL;
    struct stat sb;
    if (demo.empty() || ::stat(demo.c_str(), &sb) != 0) {
        MESSAGE("no demo model at '" << demo << "': skipped");
        return;
    }
    Model m = load(demo);
    if (!info_of(m.get()).has_tokenizer) {
        MESSAGE("demo model has no tokenizer: skipped");
        return;
    }
    Model other = load(model_path("odd"));
    check_all(m.get(), other.get());
}
