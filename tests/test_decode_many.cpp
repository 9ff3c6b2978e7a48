// needle_decode_many (issue 11 item 3): n states of one model stepped at once give, per state,
// the bits of needle_state_decode (logits and the whole saved state), at different positions,
// with f32, int8 and mixed KV, Needle 2 and Needle 3; every refusal returns its exact status
// and changes no state.
#include <doctest/doctest.h>

#include "api_util.h"

namespace {

using namespace api_test;

State make_state(needle_model *m, int32_t kv_type, uint32_t max_tokens = 0) {
    needle_state_params p = state_params();
    p.kv_type = kv_type;
    p.max_tokens = max_tokens;
    return new_state(m, p);
}

std::vector<uint8_t> blob_of(const needle_state *s) {
    size_t len = 0;
    REQUIRE(needle_state_save(s, nullptr, 0, &len) == NEEDLE_E_BUFFER_TOO_SMALL);
    std::vector<uint8_t> blob(len);
    REQUIRE(needle_state_save(s, blob.data(), blob.size(), &len) == NEEDLE_OK);
    return blob;
}

// A token id of step `t` for state `i`, above the specials (0..13).
uint32_t token_of(uint32_t i, uint32_t t, uint32_t vocab) { return 14u + (i * 131u + t * 17u + 5u) % (vocab - 14u); }

// n pairs of states (kv_types[i % size]) prefilled with prompts of different lengths; then
// `steps` steps: the reference states one needle_state_decode each, the others one
// needle_decode_many over all (every third step without logits). Logits and, at the end, the
// saved state blobs and positions must be equal bit for bit.
void many_vs_single(const std::string &path, uint32_t n, uint32_t steps, std::vector<int32_t> kv_types) {
    INFO(path << ", " << n << " states");
    Model m = load(path);
    const needle_model_info info = info_of(m.get());
    const size_t OV = info.out_vocab;
    Batch prefill = new_batch(m.get(), 16), scratch = new_batch(m.get(), std::max(n, 2u));
    std::vector<State> ref, many;
    for (uint32_t i = 0; i < n; ++i) {
        ref.push_back(make_state(m.get(), kv_types[i % kv_types.size()]));
        many.push_back(make_state(m.get(), kv_types[i % kv_types.size()]));
        std::vector<uint32_t> prompt{info.bos_id};
        for (uint32_t k = 0; k < 3 + 9 * i; ++k) prompt.push_back(token_of(i + 7, k, info.vocab_size));
        REQUIRE(needle_state_prefill(ref.back().get(), prefill.get(), prompt.data(), prompt.size(), nullptr, 0) ==
                NEEDLE_OK);
        REQUIRE(needle_state_prefill(many.back().get(), prefill.get(), prompt.data(), prompt.size(), nullptr, 0) ==
                NEEDLE_OK);
    }
    std::vector<std::vector<float>> lr(n, std::vector<float>(OV)), lm(n, std::vector<float>(OV, -1.0f));
    std::vector<needle_state *> handles(n);
    std::vector<float *> outs(n);
    for (uint32_t i = 0; i < n; ++i) handles[i] = many[i].get(), outs[i] = lm[i].data();
    std::vector<uint32_t> toks(n);
    for (uint32_t t = 0; t < steps; ++t) {
        const bool with_logits = t % 3 != 2;
        for (uint32_t i = 0; i < n; ++i) {
            toks[i] = token_of(i, t, info.vocab_size);
            REQUIRE(needle_state_decode(ref[i].get(), toks[i], with_logits ? lr[i].data() : nullptr,
                                        with_logits ? OV : 0) == NEEDLE_OK);
        }
        INFO("step " << t << ": " << needle_last_error());
        REQUIRE(needle_decode_many(handles.data(), toks.data(), n, with_logits ? outs.data() : nullptr,
                                   with_logits ? OV : 0, scratch.get()) == NEEDLE_OK);
        if (!with_logits) continue;
        for (uint32_t i = 0; i < n; ++i) {
            INFO("state " << i << " at position " << needle_state_pos(ref[i].get()));
            REQUIRE(std::memcmp(lr[i].data(), lm[i].data(), OV * sizeof(float)) == 0);
        }
    }
    for (uint32_t i = 0; i < n; ++i) {
        INFO("state " << i);
        CHECK(needle_state_pos(many[i].get()) == needle_state_pos(ref[i].get()));
        CHECK(needle_state_pos(many[i].get()) == 1 + 3 + 9 * i + steps);
        CHECK(blob_of(many[i].get()) == blob_of(ref[i].get()));
    }
}

}  // namespace

TEST_CASE("api: decode_many == single decode, bitwise: tiny, f32 KV, n = 1, 2, 8") {
    for (uint32_t n : {1u, 2u, 8u}) many_vs_single(model_path("tiny"), n, 12, {NEEDLE_KV_F32});
}

TEST_CASE("api: decode_many == single decode, bitwise: tiny, int8 and mixed KV") {
    many_vs_single(model_path("tiny"), 8, 10, {NEEDLE_KV_INT8});
    many_vs_single(model_path("tiny"), 5, 6, {NEEDLE_KV_F32, NEEDLE_KV_INT8});
}

TEST_CASE("api: decode_many == single decode, bitwise: odd and ternary") {
    many_vs_single(model_path("odd"), 8, 8, {NEEDLE_KV_F32});
    many_vs_single(model_path("ternary"), 3, 8, {NEEDLE_KV_INT8, NEEDLE_KV_F32});
}

TEST_CASE("api: decode_many == single decode, bitwise: needle2 geometry, f32 and int8 KV") {
    many_vs_single(model_path("needle2"), 8, 4, {NEEDLE_KV_F32});
    many_vs_single(model_path("needle2"), 2, 3, {NEEDLE_KV_INT8});
}

TEST_CASE("api: decode_many == single decode, bitwise: tiny3 (Needle 3), f32, int8 and mixed KV") {
    const std::string p = fixtures::v3("models/tiny3.cact");
    for (uint32_t n : {1u, 2u, 8u}) many_vs_single(p, n, 10, {NEEDLE_KV_F32});
    many_vs_single(p, 8, 8, {NEEDLE_KV_INT8});
    many_vs_single(p, 4, 6, {NEEDLE_KV_INT8, NEEDLE_KV_F32});
}

TEST_CASE("api: decode_many refusals: exact status, specific message, no state changed") {
    Model m = load(model_path("tiny"));
    Model other = load(model_path("tiny"));  // the same file, another model handle
    const needle_model_info info = info_of(m.get());
    const size_t OV = info.out_vocab;
    Batch b = new_batch(m.get(), 3), bo = new_batch(other.get(), 3);
    State s0 = make_state(m.get(), NEEDLE_KV_F32), s1 = make_state(m.get(), NEEDLE_KV_INT8);
    State s2 = make_state(m.get(), NEEDLE_KV_F32, 4), so = make_state(other.get(), NEEDLE_KV_F32);
    const uint32_t pr[] = {info.bos_id, 20, 21, 22};
    REQUIRE(needle_state_prefill(s0.get(), nullptr, pr, 4, nullptr, 0) == NEEDLE_OK);
    REQUIRE(needle_state_prefill(s1.get(), nullptr, pr, 2, nullptr, 0) == NEEDLE_OK);
    REQUIRE(needle_state_prefill(s2.get(), nullptr, pr, 3, nullptr, 0) == NEEDLE_OK);  // one left of 4
    std::vector<float> l0(OV), l1(OV), l2(OV);
    float *outs[] = {l0.data(), l1.data(), l2.data()};
    float *outs_null[] = {l0.data(), nullptr, l2.data()};
    needle_state *st[] = {s0.get(), s1.get(), s2.get()};
    const uint32_t tok[] = {30, 31, 32};
    const std::vector<std::vector<uint8_t>> before{blob_of(s0.get()), blob_of(s1.get()), blob_of(s2.get())};
    auto unchanged = [&] {
        CHECK(needle_state_pos(s0.get()) == 4);
        CHECK(needle_state_pos(s1.get()) == 2);
        CHECK(needle_state_pos(s2.get()) == 3);
        CHECK(blob_of(s0.get()) == before[0]);
        CHECK(blob_of(s1.get()) == before[1]);
        CHECK(blob_of(s2.get()) == before[2]);
    };
    auto refused = [&](needle_status want, needle_status got, const char *what) {
        INFO(what << ": " << needle_last_error());
        CHECK(got == want);
        CHECK(std::strstr(needle_last_error(), "needle_decode_many") != nullptr);
        CHECK(std::strstr(needle_last_error(), what) != nullptr);
        unchanged();
    };
    const needle_status IA = NEEDLE_E_INVALID_ARGUMENT;
    refused(IA, needle_decode_many(nullptr, tok, 2, outs, OV, b.get()), "NULL");
    refused(IA, needle_decode_many(st, nullptr, 2, outs, OV, b.get()), "NULL");
    refused(IA, needle_decode_many(st, tok, 2, outs, OV, nullptr), "NULL");
    refused(IA, needle_decode_many(st, tok, 0, outs, OV, b.get()), "n 0");
    needle_state *four[] = {s0.get(), s1.get(), s2.get(), so.get()};
    const uint32_t tok4[] = {30, 31, 32, 33};
    refused(IA, needle_decode_many(four, tok4, 4, nullptr, 0, b.get()), "capacity");
    needle_state *with_null[] = {s0.get(), nullptr};
    refused(IA, needle_decode_many(with_null, tok, 2, outs, OV, b.get()), "states[1] is NULL");
    needle_state *foreign[] = {s0.get(), so.get()};
    refused(IA, needle_decode_many(foreign, tok, 2, outs, OV, b.get()), "another model");
    refused(IA, needle_decode_many(st, tok, 2, outs, OV, bo.get()), "another model");  // batch of `other`
    needle_state *dup[] = {s0.get(), s1.get(), s0.get()};
    refused(IA, needle_decode_many(dup, tok, 3, outs, OV, b.get()), "same state");
    const uint32_t bad_tok[] = {30, info.vocab_size, 32};
    refused(IA, needle_decode_many(st, bad_tok, 3, outs, OV, b.get()), "vocab_size");
    refused(IA, needle_decode_many(st, tok, 3, nullptr, OV, b.get()), "logits is NULL");
    refused(IA, needle_decode_many(st, tok, 3, outs_null, OV, b.get()), "logits[1] is NULL");
    refused(NEEDLE_E_BUFFER_TOO_SMALL, needle_decode_many(st, tok, 3, outs, OV - 1, b.get()), "logits_len");

    // s2 takes one more position, then it is full: CONTEXT_FULL, the others not stepped either.
    REQUIRE(needle_decode_many(st + 2, tok, 1, outs, OV, b.get()) == NEEDLE_OK);
    REQUIRE(needle_state_pos(s2.get()) == 4);
    const std::vector<uint8_t> full = blob_of(s2.get());
    REQUIRE(needle_state_decode(s2.get(), 30, nullptr, 0) == NEEDLE_E_CONTEXT_FULL);
    const needle_status got = needle_decode_many(st, tok, 3, outs, OV, b.get());
    INFO(needle_last_error());
    CHECK(got == NEEDLE_E_CONTEXT_FULL);
    CHECK(std::strstr(needle_last_error(), "states[2] is full") != nullptr);
    CHECK(needle_state_pos(s0.get()) == 4);
    CHECK(needle_state_pos(s1.get()) == 2);
    CHECK(blob_of(s0.get()) == before[0]);
    CHECK(blob_of(s1.get()) == before[1]);
    CHECK(blob_of(s2.get()) == full);
    // Order of the checks (needle.h Errors): arguments, then the buffer, then room.
    CHECK(needle_decode_many(st, bad_tok, 3, outs, OV - 1, b.get()) == IA);
    CHECK(needle_decode_many(st, tok, 3, outs, OV - 1, b.get()) == NEEDLE_E_BUFFER_TOO_SMALL);
    // The two others still step (and s2 alone is refused).
    CHECK(needle_decode_many(st, tok, 2, outs, OV, b.get()) == NEEDLE_OK);
    CHECK(needle_state_pos(s0.get()) == 5);
    CHECK(needle_state_pos(s1.get()) == 3);
}
