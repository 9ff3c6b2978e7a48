// Every kernel ISA this CPU runs gives the logits of the scalar reference kernels within 1e-5
// on every v2 fixture model (issue 11): one position at a time (the decode-step kernels) and
// through batched prefill (the prefill-chunk kernels). The ISAs differ from scalar by their
// summation order and FMA rounding only, so anything larger is a kernel bug.
//
// One process switches the active table with use_kernel_isa (kernel_table.h) and loads the
// model again under each ISA, so it gets that ISA's rows-in-lanes copies.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "kernels/kernel_table.h"
#include "needle.h"

namespace {

constexpr float kIsaTol = 1e-5f;

// Logits of the model under the active ISA: every position of the first prompts (decode steps,
// at most max_pos of them), then the last row of each prompt through a chunked prefill.
std::vector<float> run_model(const std::string &name, size_t max_pos, uint32_t chunk) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
    const api_test::Model model = api_test::load(api_test::model_path(name));
    const size_t V = api_test::info_of(model.get()).vocab_size;
    const api_test::State sh = api_test::new_state(model.get());
    const api_test::Batch bh = api_test::new_batch(model.get(), chunk);
    needle_state *state = sh.get();
    std::vector<float> out, logits(V);
    size_t budget = max_pos;
    for (const auto &pr : man["prompts"]) {
        const std::vector<uint32_t> ids = pr["ids"];
        needle_state_reset(state);
        for (size_t p = 0; p < ids.size() && budget > 0; ++p, --budget) {
            REQUIRE(needle_state_decode(state, ids[p], logits.data(), V) == NEEDLE_OK);
            out.insert(out.end(), logits.begin(), logits.end());
        }
        if (budget == 0) break;
    }
    for (const auto &pr : man["prompts"]) {
        std::vector<uint32_t> ids = pr["ids"];
        if (ids.size() > max_pos) ids.resize(max_pos);
        needle_state_reset(state);
        REQUIRE(needle_state_prefill(state, bh.get(), ids.data(), ids.size(), logits.data(), V) == NEEDLE_OK);
        out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
}

void check_isas(const std::string &name, size_t max_pos) {
    const std::string initial = needle_kernel_isa();
    REQUIRE(needle::use_kernel_isa("scalar"));
    const std::vector<float> ref = run_model(name, max_pos, 32);
    int compared = 0;
    for (const char *isa : {"sse4_2", "avx2", "avx512", "neon"}) {
        if (!needle::use_kernel_isa(isa)) continue;
        ++compared;
        const std::vector<float> got = run_model(name, max_pos, 32);
        REQUIRE(got.size() == ref.size());
        float max_abs = 0.0f;
        for (size_t i = 0; i < ref.size(); ++i) max_abs = std::max(max_abs, std::fabs(got[i] - ref[i]));
        MESSAGE(name << ": " << std::string(isa) << " vs scalar, max |d logit| = " << max_abs << " over " << ref.size() << " logits");
        CHECK(max_abs <= kIsaTol);
    }
    REQUIRE(needle::use_kernel_isa(initial.c_str()));
    MESSAGE(name << ": " << compared << " vectorised ISA(s) compared");
}

}  // namespace

TEST_CASE("isa: every kernel ISA matches scalar within 1e-5: tiny") { check_isas("tiny", 400); }
TEST_CASE("isa: every kernel ISA matches scalar within 1e-5: odd") { check_isas("odd", 400); }
TEST_CASE("isa: every kernel ISA matches scalar within 1e-5: ternary") { check_isas("ternary", 400); }
TEST_CASE("isa: every kernel ISA matches scalar within 1e-5: needle2") {
    check_isas("needle2", fixtures::kSanitized ? 8 : 64);
}
