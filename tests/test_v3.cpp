// Needle 3 through the C API: batched prefill == one position at a time (bits), prefix splits,
// tokenizer cases, max_tokens, depth and info fields, the 1,512-case corruption replay, and the
// 3,300-token needle3syn prompt (local-layer ring wrapping > 3 windows).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

std::vector<uint32_t> read_ids(const std::string &rel) {
    const std::vector<uint8_t> b = fixtures::read_bytes(fixtures::v3(rel));
    std::vector<uint32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

Model load3(const std::string &name, uint32_t depth = 0) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.depth = depth;
    return load(fixtures::v3("models/" + name + ".cact"), &p);
}

State state3(needle_model *m, needle_kv_type kv, uint32_t max_tokens = 0) {
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.kv_type = kv;
    sp.max_tokens = max_tokens;
    needle_state *s = nullptr;
    INFO(needle_last_error());
    REQUIRE(needle_state_create_ex(m, &sp, &s) == NEEDLE_OK);
    return State(s);
}

// Prefill logits then `steps` greedy continuation logits, all concatenated.
std::vector<float> trace(needle_model *m, needle_kv_type kv, const std::vector<uint32_t> &ids, uint32_t chunk,
                         size_t split, size_t rows, int steps) {
    State s = state3(m, kv);
    std::vector<float> out, lg;
    if (chunk == 1) {  // one position at a time
        for (uint32_t id : ids) lg = step(s.get(), id, rows);
    } else {
        Batch b = new_batch(m, chunk);  // prefill ids[0..split) in chunks, the rest one at a time
        lg = prefill(s.get(), b.get(), std::vector<uint32_t>(ids.begin(), ids.begin() + long(split)), rows);
        for (size_t i = split; i < ids.size(); ++i) lg = step(s.get(), ids[i], rows);
    }
    out.insert(out.end(), lg.begin(), lg.end());
    for (int i = 0; i < steps; ++i) {
        lg = step(s.get(), argmax(lg), rows);
        out.insert(out.end(), lg.begin(), lg.end());
    }
    return out;
}

}  // namespace

TEST_CASE("v3 batched: tiny3 chunks 1, 7, 64, 200 and prefix splits give the same bits (f32, int8)") {
    Model m = load3("tiny3");
    const size_t rows = info_of(m.get()).out_vocab;
    const std::vector<uint32_t> ids = read_ids("refs/tiny3__gpl3_200__f32.prompt.u32");  // 200 > 6 windows
    for (needle_kv_type kv : {NEEDLE_KV_F32, NEEDLE_KV_INT8}) {
        CAPTURE(int(kv));
        const std::vector<float> ref = trace(m.get(), kv, ids, 1, 0, rows, 8);
        for (uint32_t chunk : {7u, 64u, 200u}) {
            CAPTURE(chunk);
            CHECK(same_bits(trace(m.get(), kv, ids, chunk, ids.size(), rows, 8), ref));
        }
        for (size_t split : {size_t(1), size_t(31), size_t(64), size_t(65), size_t(199)}) {
            CAPTURE(split);
            CHECK(same_bits(trace(m.get(), kv, ids, 64, split, rows, 8), ref));
        }
    }
}

// Teacher-forced rows (prefill row, then one row per fed id) of the prompt fed in chunks of
// `chunk` for its first `split` ids and one at a time after.
static std::vector<float> forced(needle_model *m, needle_kv_type kv, const std::vector<uint32_t> &ids, uint32_t chunk,
                          size_t split, const std::vector<uint32_t> &fed, size_t rows) {
    State s = state3(m, kv);
    Batch b = new_batch(m, chunk);
    std::vector<float> lg = prefill(s.get(), b.get(), std::vector<uint32_t>(ids.begin(), ids.begin() + long(split)), rows);
    for (size_t i = split; i < ids.size(); ++i) lg = step(s.get(), ids[i], rows);
    std::vector<float> out(lg);
    for (uint32_t id : fed) {
        lg = step(s.get(), id, rows);
        out.insert(out.end(), lg.begin(), lg.end());
    }
    return out;
}

// The 3,300-token case: chunk 200 == chunk 64 + 12 single steps (bits), and both match
// the peer's prefill and 16 decode rows (manifest case needle3syn__gpl3_3300__f32).
TEST_CASE("v3 batched: needle3syn 3,300-token prompt, chunk 200 == chunk 64 + one at a time, vs the peer (f32)") {
    Model m = load3("needle3syn");
    const size_t rows = info_of(m.get()).out_vocab;
    const auto man = fixtures::read_json(fixtures::v3("manifest.json"));
    nlohmann::json c;
    for (const auto &x : man["cases"])
        if (x["id"] == "needle3syn__gpl3_3300__f32") c = x;
    REQUIRE(!c.is_null());
    const std::vector<uint32_t> ids = read_ids(c["prompt_file"]), fed = c["fed_ids"];
    REQUIRE(ids.size() == 3300);
    const std::vector<float> a = forced(m.get(), NEEDLE_KV_F32, ids, 200, ids.size(), fed, rows);
    const std::vector<float> b = forced(m.get(), NEEDLE_KV_F32, ids, 64, ids.size() - 12, fed, rows);
    CHECK(same_bits(a, b));
    std::vector<float> ref = fixtures::read_f32(fixtures::v3(c["prefill_logits"]));
    const std::vector<float> dec = fixtures::read_f32(fixtures::v3(c["decode_logits"]));
    ref.insert(ref.end(), dec.begin(), dec.end());
    REQUIRE(ref.size() == a.size());
    float worst = 0.0f;
    for (size_t r = 0; r * rows < a.size(); ++r) {
        float mx = 0.0f, ss = 0.0f;
        for (size_t i = r * rows; i < (r + 1) * rows; ++i) mx = std::max(mx, std::fabs(a[i] - ref[i])), ss += ref[i] * ref[i];
        CAPTURE(r);
        CHECK(mx <= 2e-4f * std::max(1.0f, std::sqrt(ss / float(rows))));
        worst = std::max(worst, mx);
    }
    MESSAGE("needle3syn gpl3_3300 f32: max |d| " << worst << " over the prefill row and 16 decode rows");
}

TEST_CASE("v3 tokenizer: tokenizer_cases.json ids with and without BOS") {
    const auto cases = fixtures::read_json(fixtures::v3("tokenizer_cases.json"));
    std::map<std::string, Model> models;
    size_t n = 0;
    for (const auto &c : cases["cases"]) {
        const std::string name = c["model"];
        if (!models.count(name)) models.emplace(name, load3(name));
        const std::string text = c["text"];
        const std::vector<uint32_t> ids = c["ids"], with_bos = c["with_bos"];
        CAPTURE(text);
        CHECK(tokenize(models[name].get(), text, false) == ids);
        CHECK(tokenize(models[name].get(), text, true) == with_bos);
        CHECK(detokenize(models[name].get(), ids) == text);
        ++n;
    }
    CHECK(n >= 2);
}

TEST_CASE("v3 info, depth and max_tokens") {
    Model m = load3("tiny3");
    const needle_model_info info = info_of(m.get());
    CHECK(info.format_version == 3);
    CHECK(info.head_dim == 24);
    CHECK(info.v_head_dim == 32);
    CHECK(info.kv_window == 32);
    CHECK(info.out_vocab == 512);
    CHECK(info.global_layer_mask == ((1u << 2) | (1u << 5)));
    CHECK(info.qkv_conv_taps == 3);
    CHECK(info.has_confidence_head == 1);
    CHECK(info.has_contrastive_head == 0);
    CHECK(info.num_layers == 6);

    Model d5 = load3("tiny3", 5);  // [0, 1, 2, 3, 5]: globals renumbered to 2 and 4
    CHECK(info_of(d5.get()).num_layers == 5);
    CHECK(info_of(d5.get()).global_layer_mask == ((1u << 2) | (1u << 4)));
    CHECK(info_of(d5.get()).num_engram_sites == 1);
    for (uint32_t bad : {1u, 7u, 100u}) {
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.depth = bad;
        needle_model *x = nullptr;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT,
                    needle_model_load_file(fixtures::v3("models/tiny3.cact").c_str(), &p, &x), "depth");
        CHECK(x == nullptr);
    }
    {  // Needle 2 has no ladder
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.depth = 2;
        needle_model *x = nullptr;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(model_path("tiny").c_str(), &p, &x), "depth");
    }

    // max_tokens: CONTEXT_FULL exactly at the limit, the state unchanged (same next logits).
    const std::vector<uint32_t> ids = read_ids("refs/tiny3__gpl3_100__f32.prompt.u32");
    for (needle_kv_type kv : {NEEDLE_KV_F32, NEEDLE_KV_INT8}) {
        State s = state3(m.get(), kv, 40);
        State ref = state3(m.get(), kv);
        const std::vector<uint32_t> head(ids.begin(), ids.begin() + 39);
        prefill(s.get(), nullptr, head, 512);
        prefill(ref.get(), nullptr, head, 512);
        std::vector<float> lg(512);
        const std::vector<uint32_t> two(ids.begin() + 39, ids.begin() + 41);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, two.data(), 2, lg.data(), 512),
                    "max_tokens");
        CHECK(needle_state_pos(s.get()) == 39);
        CHECK(same_bits(step(s.get(), ids[39], 512), step(ref.get(), ids[39], 512)));
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), ids[40], lg.data(), 512), "max_tokens");
        CHECK(needle_state_pos(s.get()) == 40);
    }
    std::vector<float> small(511);
    State s = state3(m.get(), NEEDLE_KV_F32);
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_decode(s.get(), 5, small.data(), small.size()), "out_vocab");
    float p = 0.0f;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_confidence(s.get(), &p), "fed");
}

TEST_CASE("v3 max_tokens bounds a full-causal Needle 2 state") {
    Model m = load(model_path("tiny"));
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.kv_window = 0;
    sp.max_tokens = 5;
    needle_state *raw = nullptr;
    REQUIRE(needle_state_create_ex(m.get(), &sp, &raw) == NEEDLE_OK);
    State s(raw);
    const size_t V = info_of(m.get()).out_vocab;
    CHECK(V == info_of(m.get()).vocab_size);
    for (uint32_t i = 0; i < 5; ++i) step(s.get(), 3 + i, V);
    std::vector<float> lg(V);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), 3, lg.data(), V), "max_tokens");
}

// Virtual size of this process (/proc/self/statm, pages of 4 KB): the KV rings are one mapping
// each, so a state's KV shows in it at creation whatever is touched.
static size_t virtual_bytes() {
    std::FILE *f = std::fopen("/proc/self/statm", "r");
    unsigned long size = 0;
    const int got = f ? std::fscanf(f, "%lu", &size) : 0;
    if (f) std::fclose(f);
    return got == 1 ? size_t(size) * 4096 : 0;
}

TEST_CASE("v3 max_tokens also bounds a windowed Needle 2 state's KV, with the bits of an unbounded state") {
    Model m = load(model_path("needle2"));
    const size_t V = info_of(m.get()).out_vocab;
    auto make = [&](uint32_t max_tokens) {
        needle_state_params sp;
        sp.struct_size = sizeof sp;
        needle_state_params_init(&sp);
        sp.max_tokens = max_tokens;  // default window (256 on needle2)
        needle_state *raw = nullptr;
        REQUIRE(needle_state_create_ex(m.get(), &sp, &raw) == NEEDLE_OK);
        return State(raw);
    };
    const size_t v0 = virtual_bytes();
    State small = make(20);
    const size_t v1 = virtual_bytes();
    State full = make(0);
    const size_t v2 = virtual_bytes();
    // needle2's f32 KV: 27 layers x 2 x 4 heads x 64 x 4 bytes a position: 1.1 MB for 20, 14.2 MB
    // for the 256-slot ring.
    if (v0 && v2) CHECK(double(v2 - v1) - double(v1 - v0) > 10.0 * 1048576);
    for (uint32_t i = 0; i < 20; ++i) {
        const std::vector<float> a = step(small.get(), 7 + 13 * i, V), b = step(full.get(), 7 + 13 * i, V);
        REQUIRE(std::memcmp(a.data(), b.data(), V * sizeof(float)) == 0);
    }
    std::vector<float> lg(V);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(small.get(), 3, lg.data(), V), "max_tokens");
}
