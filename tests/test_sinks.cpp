// KV sinks in the Needle 2 attention and the Needle 3 local layers (tool-calling.md §10.3,
// SequenceOptions::sink_tokens): key j is visible to query p iff j <= p and (p - j < W or j < L).
#include <doctest/doctest.h>

#include <cstring>
#include <set>

#include "fixtures.h"
#include "model/kv_layout.h"
#include "model/model.h"

namespace {

using namespace needle;

std::shared_ptr<const Model> load_v2(const std::string &name) {
    return load_model(FileBytes::open(fixtures::v2("models/" + name + ".cact").c_str(), true), LoadOptions{});
}

std::vector<uint32_t> prompt_ids(const std::string &model, const std::string &prompt) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + model + "/manifest.json"));
    for (const auto &pr : man["prompts"])
        if (pr["name"] == prompt) return pr["ids"];
    FAIL("no prompt " << prompt);
    return {};
}

// Logits of every position, fed in chunks of `chunk` (1 = one position at a time).
std::vector<std::vector<float>> run(const Model &m, const SequenceOptions &opt, const std::vector<uint32_t> &ids,
                                    uint32_t chunk) {
    auto seq = m.new_sequence(opt);
    auto ws = m.new_workspace(chunk);
    std::vector<std::vector<float>> rows;
    for (size_t i = 0; i < ids.size(); i += chunk) {
        const uint32_t n = uint32_t(std::min<size_t>(chunk, ids.size() - i));
        // Rows of every position: feed the chunk, and for chunk 1 that is every row; for larger
        // chunks only the last row of each chunk is compared.
        std::vector<float> lg(m.info().out_vocab);
        feed(m, *seq, *ws, ids.data() + i, n, lg.data());
        rows.push_back(lg);
    }
    return rows;
}

bool same(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Fed in chunks of 7 and 64, the last row of each chunk has the bits of `seq` (one at a time).
void check_batched(const Model &m, const SequenceOptions &opt, const std::vector<uint32_t> &ids,
                   const std::vector<std::vector<float>> &seq) {
    for (uint32_t chunk : {7u, 64u}) {
        const auto c = run(m, opt, ids, chunk);
        for (size_t i = 0; i < c.size(); ++i) {
            const size_t p = std::min<size_t>((i + 1) * chunk, ids.size()) - 1;
            INFO("chunk " << chunk << " position " << p);
            CHECK(same(c[i], seq[p]));
        }
    }
}

}  // namespace

// Brute force: store key ids through the layout the attention uses, read slots lo..p as the
// kernel does (slot j % ring) and compare the set read with the rule, for every query.
TEST_CASE("sinks: the KV layout reads exactly the visible keys") {
    const uint32_t tmax = 64;
    for (uint32_t W : {0u, 1u, 2u, 3u, 5u, 8u, 40u, 63u, 64u}) {
        for (uint32_t L : {0u, 1u, 2u, 4u, 7u, 30u, 60u}) {
            const KvLayout k = KvLayout::make(W, L, tmax);
            std::vector<int64_t> slot_key(k.ring, -1);
            for (uint32_t p = 0; p < tmax; ++p) {
                REQUIRE(k.slot(p) < k.ring);
                slot_key[k.slot(p)] = p;
                std::multiset<int64_t> got;
                for (uint32_t j = k.lo(p); j <= p; ++j) got.insert(slot_key[j % k.ring]);
                std::multiset<int64_t> want;
                for (uint32_t j = 0; j <= p; ++j)
                    if (W == 0 || W >= tmax || p - j < W || j < L) want.insert(j);
                INFO("W " << W << " L " << L << " p " << p);
                REQUIRE(got == want);
            }
        }
    }
}

TEST_CASE("sinks: a prompt shorter than the window gives the logits of no sinks") {
    auto m = load_v2("tiny");  // window 48
    const std::vector<uint32_t> ids = prompt_ids("tiny", "plain");  // 39 tokens
    REQUIRE(ids.size() < 48);
    SequenceOptions plain, sinks;
    sinks.sink_tokens = 4;
    const auto a = run(*m, plain, ids, 1), b = run(*m, sinks, ids, 1);
    for (size_t p = 0; p < a.size(); ++p) {
        INFO("position " << p);
        CHECK(same(a[p], b[p]));
    }
}

TEST_CASE("sinks: they change attention once the window passed them, and batched equals sequential") {
    auto m = load_v2("tiny");
    const std::vector<uint32_t> ids = prompt_ids("tiny", "long_b");  // 190 tokens, window 48
    SequenceOptions plain, sinks;
    sinks.sink_tokens = 4;
    const auto a = run(*m, plain, ids, 1), b = run(*m, sinks, ids, 1);
    // Below position 48 every key is visible either way; from 48 on the window alone drops key
    // 0 while the sinks keep keys 0..3.
    for (size_t p = 0; p < 48; ++p) CHECK(same(a[p], b[p]));
    size_t differ = 0;
    for (size_t p = 48; p < a.size(); ++p) differ += !same(a[p], b[p]);
    CHECK(differ == a.size() - 48);
    check_batched(*m, sinks, ids, b);
    // int8 KV with sinks: batched equals sequential too.
    sinks.kv_type = KvType::INT8;
    const auto s8 = run(*m, sinks, ids, 1), c8 = run(*m, sinks, ids, 64);
    for (size_t i = 0; i < c8.size(); ++i) CHECK(same(c8[i], s8[std::min<size_t>((i + 1) * 64, ids.size()) - 1]));
}

TEST_CASE("sinks: window plus sinks covering max_seq_len is full causal") {
    auto m = load_v2("tiny");  // max_seq_len 512
    const std::vector<uint32_t> ids = prompt_ids("tiny", "long_a");
    SequenceOptions full, sinks;
    full.kv_window = 0;
    sinks.kv_window = 48;
    sinks.sink_tokens = 512 - 48;
    const auto seq = m->new_sequence(sinks);
    CHECK(seq->options.kv_window == 0);
    CHECK(seq->options.sink_tokens == 0);
    const auto a = run(*m, full, ids, 1), b = run(*m, sinks, ids, 1);
    for (size_t p = 0; p < a.size(); ++p) CHECK(same(a[p], b[p]));
}

namespace {

std::vector<uint32_t> v3_prompt(const std::string &id) {
    const std::vector<uint8_t> raw = fixtures::read_bytes(fixtures::v3("refs/" + id + ".prompt.u32"));
    std::vector<uint32_t> v(raw.size() / 4);
    std::memcpy(v.data(), raw.data(), v.size() * 4);
    return v;
}

}  // namespace

// Needle 3: the sinks live in the local layers' rings (window 32 on tiny3). Up to position
// W + sinks - 1 a sink state sees every key in every layer, which is what the same model with
// every layer global computes (global_mask_lo, container-v3.md word 17, patched to all 6
// layers): the same bits. Below W it equals no sinks; from W + sinks on it differs from both.
TEST_CASE("sinks: Needle 3 local layers keep the sink keys (all-global model below W + sinks)") {
    const std::string path = fixtures::v3("models/tiny3.cact");
    std::vector<uint8_t> bytes = fixtures::read_bytes(path);
    REQUIRE(bytes.size() > 72);
    uint32_t mask;
    std::memcpy(&mask, bytes.data() + 68, 4);
    REQUIRE(mask == ((1u << 2) | (1u << 5)));  // layers 2 and 5 (fixtures README)
    mask = 0x3Fu;
    std::memcpy(bytes.data() + 68, &mask, 4);
    auto m = load_model(FileBytes::open(path.c_str(), true), LoadOptions{});
    auto all_global = load_model(FileBytes::copy(bytes.data(), bytes.size()), LoadOptions{});
    REQUIRE(all_global->info().global_layer_mask == 0x3Fu);
    const std::vector<uint32_t> ids = v3_prompt("tiny3__gpl3_200__f32");  // 200 tokens
    const uint32_t W = m->info().kv_window, S = 8;
    REQUIRE(W == 32);
    for (KvType kv : {KvType::F32, KvType::INT8}) {
        CAPTURE(int(kv));
        SequenceOptions plain, sinks;
        plain.kv_type = sinks.kv_type = kv;
        sinks.sink_tokens = S;
        CHECK(m->new_sequence(sinks)->options.sink_tokens == S);
        const auto a = run(*m, plain, ids, 1), b = run(*m, sinks, ids, 1), gl = run(*all_global, plain, ids, 1);
        for (size_t p = 0; p < W; ++p) CHECK(same(a[p], b[p]));
        for (size_t p = 0; p < W + S; ++p) CHECK(same(gl[p], b[p]));
        size_t differ_plain = 0, differ_global = 0;
        for (size_t p = W + S; p < ids.size(); ++p) differ_plain += !same(a[p], b[p]), differ_global += !same(gl[p], b[p]);
        CHECK(differ_plain == ids.size() - W - S);
        CHECK(differ_global == ids.size() - W - S);
        check_batched(*m, sinks, ids, b);
    }
    // Window plus sinks covering max_seq_len: every local layer is global, no sinks reported.
    SequenceOptions wide;
    wide.sink_tokens = m->info().max_seq_len - W;
    CHECK(m->new_sequence(wide)->options.sink_tokens == 0);
    const auto w = run(*m, wide, ids, 1), gl = run(*all_global, SequenceOptions{}, ids, 1);
    for (size_t p = 0; p < ids.size(); ++p) CHECK(same(w[p], gl[p]));
}
