// Needle 3 logits against the peer engine (shared/fixtures/v3/README.md): every manifest case
// teacher-forced (prefill row + 16 decode rows), f32 and int8 KV, ladder rungs, and the
// confidence head over the prompt.
// Bounds (issue 8): f32 max |d| <= 2e-4 * max(1, rms(row)); int8 <= 5e-3; argmax equal where the
// reference margin > 1e-2; |sigma(got) - sigma(ref)| <= 1e-4 for the confidence.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

std::vector<uint32_t> read_u32(const std::string &path) {
    const std::vector<uint8_t> b = fixtures::read_bytes(path);
    std::vector<uint32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

float rms(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
    return float(std::sqrt(s / double(n)));
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

struct Worst {
    float rel = 0.0f;  // max |d| / max(1, rms)
    float abs = 0.0f;
};

// Loads model `name` at `depth` (0 = full).
Model load_v3(const std::string &name, uint32_t depth) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.depth = depth;
    return load(fixtures::v3("models/" + name + ".cact"), &p);
}

State new_state_kv(needle_model *m, const std::string &kv, uint32_t max_tokens = 0) {
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.kv_type = kv == "int8" ? NEEDLE_KV_INT8 : NEEDLE_KV_F32;
    sp.max_tokens = max_tokens;
    needle_state *s = nullptr;
    REQUIRE(needle_state_create_ex(m, &sp, &s) == NEEDLE_OK);
    return State(s);
}

// One manifest case, teacher-forced through a batch of `chunk` positions.
Worst run_case(const nlohmann::json &c, needle_model *m, uint32_t chunk) {
    const std::string id = c["id"], kv = c["kv"];
    const size_t rows = c["rows"];
    const std::vector<uint32_t> prompt = read_u32(fixtures::v3(c["prompt_file"]));
    const std::vector<float> pre = fixtures::read_f32(fixtures::v3(c["prefill_logits"]));
    const std::vector<float> dec = fixtures::read_f32(fixtures::v3(c["decode_logits"]));
    const std::vector<uint32_t> fed = c["fed_ids"];
    const std::vector<float> margins = c["argmax_margins"];
    REQUIRE(prompt.size() == size_t(c["prompt_len"]));
    REQUIRE(pre.size() == rows);
    REQUIRE(dec.size() == rows * fed.size());
    const float tol = kv == "int8" ? 5e-3f : 2e-4f;
    State s = new_state_kv(m, kv);
    Batch b = new_batch(m, chunk);
    Worst w;
    auto check_row = [&](const std::vector<float> &got, const float *ref, size_t row) {
        float mx = 0.0f;
        for (size_t i = 0; i < rows; ++i) mx = std::max(mx, std::fabs(got[i] - ref[i]));
        const float scale = std::max(1.0f, rms(ref, rows));
        INFO(id << " row " << row << ": max|d| " << mx << " (rms " << scale << ")");
        CHECK(mx <= tol * scale);
        if (margins[row] > 1e-2f) CHECK(argmax(got) == uint32_t(std::max_element(ref, ref + rows) - ref));
        w.rel = std::max(w.rel, mx / scale), w.abs = std::max(w.abs, mx);
    };
    check_row(prefill(s.get(), b.get(), prompt, rows), pre.data(), 0);
    if (c.contains("confidence_logit") && !c["confidence_logit"].is_null()) {
        float p = 0.0f;
        REQUIRE(needle_state_confidence(s.get(), &p) == NEEDLE_OK);
        const float ref = sigmoid(float(c["confidence_logit"]));
        INFO(id << ": confidence " << p << " vs " << ref);
        CHECK(std::fabs(p - ref) <= 1e-4f);
    }
    for (size_t i = 0; i < fed.size(); ++i) check_row(step(s.get(), fed[i], rows), dec.data() + i * rows, i + 1);
    return w;
}

void run_model(const std::string &model, bool (*want)(const nlohmann::json &)) {
    const auto man = fixtures::read_json(fixtures::v3("manifest.json"));
    std::map<uint32_t, Model> models;
    std::map<std::string, float> worst;
    for (const auto &c : man["cases"]) {
        if (c["model"] != model || !want(c)) continue;
        const uint32_t depth = c["depth"];
        if (!models.count(depth)) models.emplace(depth, load_v3(model, depth));
        const Worst w = run_case(c, models[depth].get(), 64);
        const std::string key = std::string(c["kv"]);
        worst[key] = std::max(worst[key], w.abs);
        MESSAGE(std::string(c["id"]) << ": max |d| " << w.abs << " (relative " << w.rel << ")");
    }
    for (const auto &kv : worst) MESSAGE(model << " " << kv.first << ": max |dlogit| " << kv.second);
}

}  // namespace

TEST_CASE("v3 logits: tiny3 cases match the peer (f32 and int8, ladder rungs)") {
    run_model("tiny3", [](const nlohmann::json &) { return true; });
}

TEST_CASE("v3 logits: needle3syn chat matches the peer (f32 and int8)") {
    run_model("needle3syn", [](const nlohmann::json &c) { return c["case"] == "chat"; });
}

// The f32 3,300-token case runs in "v3 batched: needle3syn ..." (with its chunking checks).
TEST_CASE("v3 logits: needle3syn gpl3_3300 int8 matches the peer") {
    run_model("needle3syn", [](const nlohmann::json &c) { return c["id"] == "needle3syn__gpl3_3300__int8"; });
}
