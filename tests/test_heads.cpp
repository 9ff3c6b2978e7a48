// Probe heads (model-v2.md §7) against the upstream references of shared/fixtures/v2 (README,
// "heads": window = kv_window, the state's default): confidence logit within 1e-3, contrastive
// embedding within 1e-4, for every prompt of every model with heads; and the C API's contract.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "api_util.h"

namespace {

using namespace api_test;

struct HeadDelta {
    double logit = 0, embedding = 0;
};

// Feeds ids (in chunks of `chunk` through a batch, 0 = one decode step at a time) and returns
// the confidence logit and the embedding.
void heads_of(needle_model *m, const std::vector<uint32_t> &ids, uint32_t chunk, double &logit,
              std::vector<float> &emb) {
    State s = new_state(m);
    if (chunk == 0) {
        for (uint32_t id : ids) REQUIRE(needle_state_decode(s.get(), id, nullptr, 0) == NEEDLE_OK);
    } else {
        Batch b = new_batch(m, chunk);
        REQUIRE(needle_state_prefill(s.get(), b.get(), ids.data(), ids.size(), nullptr, 0) == NEEDLE_OK);
    }
    float p = -1.0f;
    REQUIRE(needle_state_confidence(s.get(), &p) == NEEDLE_OK);
    REQUIRE(p > 0.0f);
    REQUIRE(p < 1.0f);
    logit = std::log(double(p)) - std::log1p(-double(p));
    size_t dim = 0;
    emb.assign(128, 0.0f);
    INFO(needle_last_error());
    REQUIRE(needle_state_embedding(s.get(), emb.data(), emb.size(), &dim) == NEEDLE_OK);
    REQUIRE(dim == 128);
}

HeadDelta check_prompts(const std::string &name, uint32_t chunk) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
    Model m = load(model_path(name));
    HeadDelta worst;
    for (const auto &pr : man["prompts"]) {
        const std::vector<uint32_t> ids = pr["ids"];
        const double ref_logit = pr["heads"]["confidence_logit"];
        const std::vector<float> ref = fixtures::read_f32(fixtures::v2(pr["heads"]["contrastive"]["file"]));
        double logit = 0;
        std::vector<float> emb;
        heads_of(m.get(), ids, chunk, logit, emb);
        REQUIRE(ref.size() == emb.size());
        double de = 0, norm = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            de = std::max(de, std::fabs(double(emb[i]) - double(ref[i])));
            norm += double(emb[i]) * emb[i];
        }
        const double dl = std::fabs(logit - ref_logit);
        INFO(name << "/" << std::string(pr["name"]) << ": logit " << logit << " vs " << ref_logit);
        CHECK(dl <= 1e-3);
        CHECK(de <= 1e-4);
        CHECK(std::fabs(norm - 1.0) < 1e-5);
        MESSAGE(name << "/" << std::string(pr["name"]) << " (" << ids.size() << " tokens): |d logit| " << dl
                     << ", max |d emb| " << de);
        worst.logit = std::max(worst.logit, dl);
        worst.embedding = std::max(worst.embedding, de);
    }
    return worst;
}

}  // namespace

TEST_CASE("heads: tiny fixture confidence and contrastive") { check_prompts("tiny", 0); }
TEST_CASE("heads: ternary fixture confidence and contrastive") { check_prompts("ternary", 0); }
TEST_CASE("heads: needle2 fixture confidence and contrastive") {
    if (fixtures::kSanitized) return;  // 27 layers x 923 positions: minutes under ASan
    check_prompts("needle2", 32);
}

// Pooling does not depend on how the positions were chunked: bit-identical head outputs.
TEST_CASE("heads: batched prefill gives the bits of one position at a time") {
    const auto man = fixtures::read_json(fixtures::v2("refs/tiny/manifest.json"));
    Model m = load(model_path("tiny"));
    for (const auto &pr : man["prompts"]) {
        const std::vector<uint32_t> ids = pr["ids"];
        double l0 = 0;
        std::vector<float> e0;
        heads_of(m.get(), ids, 0, l0, e0);
        for (uint32_t chunk : {1u, 7u, 64u}) {
            double l = 0;
            std::vector<float> e;
            heads_of(m.get(), ids, chunk, l, e);
            INFO(std::string(pr["name"]) << " chunk " << chunk);
            CHECK(l == l0);
            CHECK(same_bits(e, e0));
        }
    }
}

TEST_CASE("heads: API contract") {
    Model tiny = load(model_path("tiny"));
    Model odd = load(model_path("odd"));
    State s = new_state(tiny.get());
    float p = 0.5f;
    size_t dim = 7;
    float emb[128];
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_confidence(nullptr, &p), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_confidence(s.get(), nullptr), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_confidence(s.get(), &p), "no position");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_embedding(s.get(), emb, 128, &dim), "no position");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_embedding(s.get(), nullptr, 4, &dim), "NULL");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_embedding(s.get(), emb, 128, nullptr), "NULL");
    REQUIRE(needle_state_decode(s.get(), 2, nullptr, 0) == NEEDLE_OK);
    dim = 0;
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_embedding(s.get(), emb, 127, &dim), "127|128");
    CHECK(dim == 128);
    dim = 0;
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_embedding(s.get(), nullptr, 0, &dim), "128");
    CHECK(dim == 128);
    CHECK(needle_state_confidence(s.get(), &p) == NEEDLE_OK);
    // PAD (id 0) cells are excluded: feeding PAD leaves both heads where they were.
    float p2 = 0.0f, e1[128], e2[128];
    REQUIRE(needle_state_embedding(s.get(), e1, 128, &dim) == NEEDLE_OK);
    REQUIRE(needle_state_decode(s.get(), 0, nullptr, 0) == NEEDLE_OK);
    REQUIRE(needle_state_confidence(s.get(), &p2) == NEEDLE_OK);
    REQUIRE(needle_state_embedding(s.get(), e2, 128, &dim) == NEEDLE_OK);
    CHECK(p2 == p);
    CHECK(std::memcmp(e1, e2, sizeof e1) == 0);
    // Reset forgets the pooled positions.
    needle_state_reset(s.get());
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_confidence(s.get(), &p), "no position");
    // A model without heads.
    State so = new_state(odd.get());
    REQUIRE(needle_state_decode(so.get(), 2, nullptr, 0) == NEEDLE_OK);
    EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_state_confidence(so.get(), &p), "confidence");
    EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_state_embedding(so.get(), emb, 128, &dim), "contrastive");
}

// needle_state_params.probe_heads 0: the pooling is skipped, the logits keep their bits, and the
// heads answer UNSUPPORTED with a message that names the option. Needle 2 (tiny) and Needle 3
// (tiny3, a confidence head), prefill through a batch and decode steps.
TEST_CASE("heads: probe_heads 0 skips the pooling with the same logits, and the heads say why") {
    for (const std::string path : {model_path("tiny"), fixtures::v3("models/tiny3.cact")}) {
        CAPTURE(path);
        Model m = load(path);
        const needle_model_info info = info_of(m.get());
        REQUIRE(info.has_confidence_head == 1);
        const size_t V = info.out_vocab;
        const std::vector<uint32_t> ids = tokenize(m.get(), "Set a timer for five minutes, please.", true);
        needle_state_params off = state_params();
        CHECK(off.probe_heads == 1);
        off.probe_heads = 0;
        State a = new_state(m.get()), b = new_state(m.get(), off);
        Batch batch = new_batch(m.get(), 8);
        CHECK(same_bits(prefill(a.get(), batch.get(), ids, V), prefill(b.get(), batch.get(), ids, V)));
        uint32_t tok = ids.back();
        for (int i = 0; i < 6; ++i) {
            const std::vector<float> la = step(a.get(), tok, V), lb = step(b.get(), tok, V);
            REQUIRE(same_bits(la, lb));
            tok = argmax(la);
        }
        float p = -1.0f;
        REQUIRE(needle_state_confidence(a.get(), &p) == NEEDLE_OK);
        EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_state_confidence(b.get(), &p), "probe_heads");
        if (info.has_contrastive_head) {
            float emb[256];
            size_t dim = 0;
            REQUIRE(needle_state_embedding(a.get(), emb, 256, &dim) == NEEDLE_OK);
            EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_state_embedding(b.get(), emb, 256, &dim), "probe_heads");
        }
        // The two states hold different options: no copy between them, no blob of one loads into the other.
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_copy(a.get(), b.get()), "option");
        size_t len = 0;
        CHECK(needle_state_save(b.get(), nullptr, 0, &len) == NEEDLE_E_BUFFER_TOO_SMALL);
        std::vector<uint8_t> blob(len);
        REQUIRE(needle_state_save(b.get(), blob.data(), blob.size(), &len) == NEEDLE_OK);
        EXPECT_FAIL(NEEDLE_E_FORMAT, needle_state_load(a.get(), blob.data(), blob.size()), "option");
        State c = new_state(m.get(), off);
        REQUIRE(needle_state_load(c.get(), blob.data(), blob.size()) == NEEDLE_OK);
        CHECK(same_bits(step(b.get(), tok, V), step(c.get(), tok, V)));
    }
    // Values other than 0 and 1 are refused; a struct_size that ends before the field means 1.
    Model m = load(model_path("tiny"));
    needle_state_params sp = state_params();
    for (int32_t v : {2, -1, 100}) {
        sp.probe_heads = v;
        needle_state *s = reinterpret_cast<needle_state *>(uintptr_t(1));
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create_ex(m.get(), &sp, &s), "probe_heads", std::to_string(v));
        CHECK(s == nullptr);
    }
    sp.probe_heads = 0;
    sp.struct_size = uint32_t(offsetof(needle_state_params, probe_heads));
    State old = new_state(m.get(), sp);
    REQUIRE(needle_state_decode(old.get(), 5, nullptr, 0) == NEEDLE_OK);
    float p = -1.0f;
    CHECK(needle_state_confidence(old.get(), &p) == NEEDLE_OK);
}
