// Logits against the upstream reference forward pass (shared/fixtures/v2/README.md):
// every model, every prompt, every prompt position and the 16-step greedy decode trace.
// Bound: max |logit - ref| <= 1e-4; argmax equal wherever the reference top-2 gap > 2e-4.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "fixtures.h"
#include "needle.h"

namespace {

constexpr float kTol = 1e-4f;
constexpr float kMargin = 2e-4f;

struct ModelHandles {
    needle_model *model = nullptr;
    needle_state *state = nullptr;
    ~ModelHandles() {
        needle_state_free(state);
        needle_model_free(model);
    }
};

struct RowCheck {
    float max_abs = 0.0f;
    size_t argmax_mismatch = 0, rows = 0;
    float closest_margin = INFINITY;  // smallest reference top-2 gap seen
};

uint32_t argmax(const float *v, size_t n) { return uint32_t(std::max_element(v, v + n) - v); }

float top2_gap(const float *v, size_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        if (v[i] > a) b = a, a = v[i];
        else if (v[i] > b) b = v[i];
    }
    return a - b;
}

void compare_row(const float *got, const float *ref, size_t V, RowCheck &rc) {
    for (size_t i = 0; i < V; ++i) rc.max_abs = std::max(rc.max_abs, std::fabs(got[i] - ref[i]));
    const float gap = top2_gap(ref, V);
    rc.closest_margin = std::min(rc.closest_margin, gap);
    if (gap > kMargin && argmax(got, V) != argmax(ref, V)) ++rc.argmax_mismatch;
    ++rc.rows;
}

void check_model(const std::string &name) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
    ModelHandles h;
    REQUIRE(needle_model_load_file(fixtures::v2("models/" + name + ".cact").c_str(), nullptr, &h.model) == NEEDLE_OK);
    needle_model_info info{};
    info.struct_size = sizeof info;
    REQUIRE(needle_model_get_info(h.model, &info) == NEEDLE_OK);
    const size_t V = info.vocab_size;
    REQUIRE(needle_state_create(h.model, &h.state) == NEEDLE_OK);
    std::vector<float> logits(V);
    float model_max = 0.0f;

    for (const auto &pr : man["prompts"]) {
        const std::string pname = pr["name"];
        const std::vector<uint32_t> ids = pr["ids"];
        const std::vector<float> full = fixtures::read_f32(fixtures::v2(pr["full"]["file"]));
        const std::vector<float> dec = fixtures::read_f32(fixtures::v2(pr["decode"]["file"]));
        const std::vector<uint32_t> dec_in = pr["decode"]["input_ids"];
        REQUIRE(full.size() == ids.size() * V);
        REQUIRE(dec.size() == dec_in.size() * V);

        // Prompt pass, one position at a time, every row.
        needle_state_reset(h.state);
        RowCheck prompt_rc, decode_rc;
        for (size_t p = 0; p < ids.size(); ++p) {
            REQUIRE(needle_state_decode(h.state, ids[p], logits.data(), V) == NEEDLE_OK);
            compare_row(logits.data(), full.data() + p * V, V, prompt_rc);
        }
        // Greedy decode trace (the reference's fed tokens).
        for (size_t i = 0; i < dec_in.size(); ++i) {
            REQUIRE(needle_state_decode(h.state, dec_in[i], logits.data(), V) == NEEDLE_OK);
            compare_row(logits.data(), dec.data() + i * V, V, decode_rc);
        }
        // The prompt through needle_state_prefill (no batch): the reference's last row.
        needle_state_reset(h.state);
        RowCheck prefill_rc;
        REQUIRE(needle_state_prefill(h.state, nullptr, ids.data(), ids.size(), logits.data(), V) == NEEDLE_OK);
        compare_row(logits.data(), full.data() + (ids.size() - 1) * V, V, prefill_rc);
        CHECK(needle_state_pos(h.state) == ids.size());

        INFO(name << "/" << pname << ": prompt max|d| " << prompt_rc.max_abs << ", decode max|d| "
                  << decode_rc.max_abs << ", closest ref top-2 gap "
                  << std::min(prompt_rc.closest_margin, decode_rc.closest_margin));
        CHECK(prompt_rc.max_abs <= kTol);
        CHECK(decode_rc.max_abs <= kTol);
        CHECK(prefill_rc.max_abs <= kTol);
        CHECK(prompt_rc.argmax_mismatch == 0);
        CHECK(decode_rc.argmax_mismatch == 0);
        model_max = std::max({model_max, prompt_rc.max_abs, decode_rc.max_abs, prefill_rc.max_abs});
    }
    MESSAGE(name << ": max |logit - ref| over all prompts = " << model_max);
}

}  // namespace

TEST_CASE("logits v2: tiny matches the upstream reference") { check_model("tiny"); }
TEST_CASE("logits v2: odd matches the upstream reference") { check_model("odd"); }
TEST_CASE("logits v2: ternary matches the upstream reference") { check_model("ternary"); }
TEST_CASE("logits v2: needle2 matches the upstream reference") { check_model("needle2"); }
