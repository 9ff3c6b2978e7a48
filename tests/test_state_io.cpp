// needle_state_copy / needle_state_save / needle_state_load (issue 9 item 2): bit-identical
// continuation (f32 and int8 KV, with the KV ring wrapped), and refusal of every damaged,
// truncated or foreign blob with the state unchanged.
#include <doctest/doctest.h>

#include "api_util.h"

namespace {

using namespace api_test;

State new_state_kv(needle_model *m, int32_t kv_type) {
    needle_state_params p = state_params();
    p.kv_type = kv_type;
    return new_state(m, p);
}

std::vector<uint8_t> save(const needle_state *s) {
    size_t len = 0;
    REQUIRE(needle_state_save(s, nullptr, 0, &len) == NEEDLE_E_BUFFER_TOO_SMALL);
    std::vector<uint8_t> blob(len);
    size_t len2 = 0;
    REQUIRE(needle_state_save(s, blob.data(), blob.size(), &len2) == NEEDLE_OK);
    REQUIRE(len2 == len);
    return blob;
}

// Greedy continuation of n steps from the state's last logits `lg`: every step's logits.
std::vector<std::vector<float>> continue_greedy(needle_state *s, std::vector<float> lg, int n) {
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < n; ++i) {
        lg = step(s, argmax(lg), lg.size());
        rows.push_back(lg);
    }
    return rows;
}

std::vector<uint32_t> prompt_ids(const std::string &model, const std::string &prompt) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + model + "/manifest.json"));
    for (const auto &pr : man["prompts"])
        if (pr["name"] == prompt) return pr["ids"];
    FAIL("no prompt " << prompt);
    return {};
}

std::vector<uint32_t> v3_prompt(const std::string &id) {
    const std::vector<uint8_t> raw = fixtures::read_bytes(fixtures::v3("refs/" + id + ".prompt.u32"));
    std::vector<uint32_t> v(raw.size() / 4);
    std::memcpy(v.data(), raw.data(), v.size() * 4);
    return v;
}

// Prefills `ids` into a state, copies it into a used state and saves it; then the original, the
// copy and a state of another handle of the same file loaded from the blob continue greedily
// with the same bits, and their confidence (when `heads`) agrees.
void check_continuations(const std::string &path, const std::vector<uint32_t> &ids, int32_t kv_type, bool heads) {
    Model m = load(path);
    const size_t V = info_of(m.get()).out_vocab;
    Batch b = new_batch(m.get(), 32);
    State a = new_state_kv(m.get(), kv_type);
    const std::vector<float> lg = prefill(a.get(), b.get(), ids, V);

    // Copy into a used state (it held another sequence), save into a blob.
    State c = new_state_kv(m.get(), kv_type);
    prefill(c.get(), b.get(), {2, 5, 6, 7}, V);
    REQUIRE(needle_state_copy(c.get(), a.get()) == NEEDLE_OK);
    CHECK(needle_state_pos(c.get()) == ids.size());
    const std::vector<uint8_t> blob = save(a.get());
    float pa = 0, pc = 0;
    if (heads) REQUIRE(needle_state_confidence(a.get(), &pa) == NEEDLE_OK);

    const auto want = continue_greedy(a.get(), lg, 20);
    if (heads) REQUIRE(needle_state_confidence(c.get(), &pc) == NEEDLE_OK);
    CHECK(pc == pa);
    const auto got_copy = continue_greedy(c.get(), lg, 20);
    // Load into a state of another handle of the same file (the fingerprint is the file's).
    Model m2 = load(path);
    State l = new_state_kv(m2.get(), kv_type);
    REQUIRE(needle_state_load(l.get(), blob.data(), blob.size()) == NEEDLE_OK);
    CHECK(needle_state_pos(l.get()) == ids.size());
    const auto got_load = continue_greedy(l.get(), lg, 20);
    for (int i = 0; i < 20; ++i) {
        INFO("step " << i);
        CHECK(same_bits(got_copy[i], want[i]));
        CHECK(same_bits(got_load[i], want[i]));
    }
    // The heads continue too: the pooled state came along.
    float p1 = 0, p2 = 0;
    if (!heads) return;
    REQUIRE(needle_state_confidence(a.get(), &p1) == NEEDLE_OK);
    REQUIRE(needle_state_confidence(l.get(), &p2) == NEEDLE_OK);
    CHECK(p1 == p2);
}

// A failed load must leave the state exactly as it was: its own blob is unchanged.
void expect_refused(needle_state *s, const std::vector<uint8_t> &before, const uint8_t *blob, size_t len) {
    const needle_status st = needle_state_load(s, blob, len);
    CHECK(st == NEEDLE_E_FORMAT);
    if (st == NEEDLE_OK) REQUIRE(needle_state_load(s, before.data(), before.size()) == NEEDLE_OK);
}

}  // namespace

// long_a: 176 tokens, the window of 48 wraps.
TEST_CASE("state: copy and save/load continue bit-identically, f32 KV") {
    check_continuations(model_path("tiny"), prompt_ids("tiny", "long_a"), NEEDLE_KV_F32, true);
}
TEST_CASE("state: copy and save/load continue bit-identically, int8 KV") {
    check_continuations(model_path("tiny"), prompt_ids("tiny", "long_a"), NEEDLE_KV_INT8, true);
}
TEST_CASE("state: copy and save/load continue bit-identically, odd (full causal, no heads)") {
    check_continuations(model_path("odd"), prompt_ids("odd", "long_a"), NEEDLE_KV_F32, false);
}
// Needle 3: local rings (window 32) wrapped > 6 times by 200 tokens, global layers, Q/K/V conv
// tails, Engram value rings, confidence pooling; int8 also its K and V scales.
TEST_CASE("state: Needle 3 copy and save/load continue bit-identically, f32 and int8 KV") {
    for (int32_t kv : {NEEDLE_KV_F32, NEEDLE_KV_INT8}) {
        CAPTURE(kv);
        check_continuations(fixtures::v3("models/tiny3.cact"), v3_prompt("tiny3__gpl3_200__f32"), kv, true);
        // A short prompt: rings, tails and Engram rows only partly written (used < bytes).
        check_continuations(fixtures::v3("models/tiny3.cact"), v3_prompt("tiny3__gpl3_001__f32"), kv, true);
    }
}

TEST_CASE("state: Needle 3 damaged and foreign blobs are refused, state unchanged") {
    Model m = load(fixtures::v3("models/tiny3.cact")), m2 = load(model_path("tiny"));
    const size_t V = info_of(m.get()).out_vocab;
    State src = new_state_kv(m.get(), NEEDLE_KV_INT8);
    prefill(src.get(), nullptr, v3_prompt("tiny3__gpl3_007__f32"), V);
    const std::vector<uint8_t> blob = save(src.get());
    State dst = new_state_kv(m.get(), NEEDLE_KV_INT8);
    prefill(dst.get(), nullptr, {5, 6, 7}, V);
    const std::vector<uint8_t> before = save(dst.get());
    // Every 7th byte flipped (the whole blob is covered by the odd test above; this is v3's
    // layout), and every truncation.
    std::vector<uint8_t> bad = blob;
    for (size_t i = 0; i < bad.size(); i += 7) {
        bad[i] ^= 0x10;
        if (needle_state_load(dst.get(), bad.data(), bad.size()) != NEEDLE_E_FORMAT) FAIL_CHECK("byte " << i);
        bad[i] ^= 0x10;
    }
    for (size_t len = 0; len < blob.size(); len += 13)
        if (needle_state_load(dst.get(), blob.data(), len) != NEEDLE_E_FORMAT) FAIL_CHECK("truncation to " << len);
    // f32 options, another model's blob, a blob past this state's max_tokens.
    State f32 = new_state_kv(m.get(), NEEDLE_KV_F32);
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(f32.get(), blob.data(), blob.size()), "options");
    State v2 = new_state_kv(m2.get(), NEEDLE_KV_INT8);
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(v2.get(), blob.data(), blob.size()), "another model");
    const std::vector<uint8_t> v2_blob = save(v2.get());
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(dst.get(), v2_blob.data(), v2_blob.size()), "another model");
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.kv_type = NEEDLE_KV_INT8, sp.max_tokens = 4;  // the blob holds 7 positions
    needle_state *raw = nullptr;
    REQUIRE(needle_state_create_ex(m.get(), &sp, &raw) == NEEDLE_OK);
    State small(raw);
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(small.get(), blob.data(), blob.size()), "max_tokens");
    CHECK(needle_state_pos(small.get()) == 0);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(small.get(), src.get()), "options");
    CHECK(save(dst.get()) == before);
    REQUIRE(needle_state_load(dst.get(), blob.data(), blob.size()) == NEEDLE_OK);
    CHECK(save(dst.get()) == blob);
}

TEST_CASE("state: every flipped byte and every truncation of a blob is refused, state unchanged") {
    Model m = load(model_path("odd"));
    const size_t V = info_of(m.get()).vocab_size;
    State src = new_state(m.get());
    prefill(src.get(), nullptr, {2, 300, 301, 302}, V);
    const std::vector<uint8_t> blob = save(src.get());
    MESSAGE("odd blob after 4 tokens: " << blob.size() << " bytes");
    State dst = new_state(m.get());
    prefill(dst.get(), nullptr, {2, 9}, V);
    const std::vector<uint8_t> before = save(dst.get());
    std::vector<uint8_t> bad = blob;
    size_t refused = 0;
    for (size_t i = 0; i < bad.size(); ++i) {
        for (uint8_t flip : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF)}) {
            bad[i] ^= flip;
            const needle_status st = needle_state_load(dst.get(), bad.data(), bad.size());
            refused += st == NEEDLE_E_FORMAT;
            if (st != NEEDLE_E_FORMAT) FAIL_CHECK("byte " << i << " ^ " << int(flip) << " accepted: " << st);
            bad[i] ^= flip;
        }
    }
    CHECK(refused == 3 * blob.size());
    for (size_t len = 0; len < blob.size(); ++len) {
        if (needle_state_load(dst.get(), blob.data(), len) != NEEDLE_E_FORMAT) FAIL_CHECK("truncation to " << len);
    }
    CHECK(save(dst.get()) == before);  // none of those loads touched the state
    // Trailing garbage is no blob of this state either.
    std::vector<uint8_t> longer = blob;
    longer.push_back(0);
    expect_refused(dst.get(), before, longer.data(), longer.size());
    CHECK(save(dst.get()) == before);
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(dst.get(), blob.data(), 7), "state blob");
    bad[20] ^= 1;
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(dst.get(), bad.data(), bad.size()), "checksum");
    CHECK(save(dst.get()) == before);
    // The original blob still loads.
    REQUIRE(needle_state_load(dst.get(), blob.data(), blob.size()) == NEEDLE_OK);
    CHECK(save(dst.get()) == blob);
}

TEST_CASE("state: foreign blobs and API contract") {
    Model tiny = load(model_path("tiny")), ternary = load(model_path("ternary"));
    const size_t V = info_of(tiny.get()).vocab_size;
    State t = new_state(tiny.get()), r = new_state(ternary.get());
    State t8 = new_state_kv(tiny.get(), NEEDLE_KV_INT8);
    prefill(t.get(), nullptr, {2, 40, 41}, V);
    prefill(r.get(), nullptr, {2, 40, 41}, V);
    const std::vector<uint8_t> tb = save(t.get()), rb = save(r.get());
    State fresh = new_state(tiny.get());
    const std::vector<uint8_t> empty = save(fresh.get());
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(fresh.get(), rb.data(), rb.size()), "another model");
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(t8.get(), tb.data(), tb.size()), "options");
    CHECK(save(fresh.get()) == empty);
    CHECK(needle_state_pos(t8.get()) == 0);

    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(fresh.get(), r.get()), "different models");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(t8.get(), t.get()), "options");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(nullptr, t.get()), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(t.get(), nullptr), "NULL");
    CHECK(needle_state_copy(t.get(), t.get()) == NEEDLE_OK);
    size_t len = 0;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_save(nullptr, nullptr, 0, &len), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_save(t.get(), nullptr, 0, nullptr), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_save(t.get(), nullptr, 5, &len), "NULL");
    std::vector<uint8_t> small(tb.size() - 1, 0xAB);
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_save(t.get(), small.data(), small.size(), &len), "cap");
    CHECK(len == tb.size());
    CHECK(std::all_of(small.begin(), small.end(), [](uint8_t x) { return x == 0xAB; }));
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_load(nullptr, tb.data(), tb.size()), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_load(t.get(), nullptr, 4), "NULL");
    EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(t.get(), nullptr, 0), "state blob");
    // Only what the position uses is stored: 3 tokens of history, 3 KV rows in each of the
    // 4 layers x 2 (K, V) x 2 kv heads rings (head_dim 32), 3 Engram value rows of 2 sites.
    CHECK(tb.size() == empty.size() + 3 * 4 + 3 * (4 * 2 * 2 * 32 * 4) + 3 * (2 * 128 * 4));
}
