// NEEDLE_PRECISION_FAST (issue 11, cq_fast.h): int8 activations per CQ group times int8 codebook
// levels. Measured against the fixture references on every v2 and v3 model: max |dlogit| and
// greedy argmax agreement where the reference top-1 margin exceeds 0.1 (the bounds below are
// the measured figures, rounded up); batched prefill equals sequential decode bit for bit; every
// kernel ISA gives the bits of the scalar FAST reference; the params field follows the ABI rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"
#include "needle.h"

using namespace api_test;

namespace {

constexpr float kMargin = 0.1f;  // rows whose reference top-1 margin exceeds this count for argmax

needle_model_params fast_params(uint32_t depth = 0) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.depth = depth;
    p.precision = NEEDLE_PRECISION_FAST;
    return p;
}

uint32_t argmax_of(const float *v, size_t n) { return uint32_t(std::max_element(v, v + n) - v); }

float margin_of(const float *v, size_t n) {
    float a = -INFINITY, b = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        if (v[i] > a) b = a, a = v[i];
        else if (v[i] > b) b = v[i];
    }
    return a - b;
}

struct Err {
    float max_abs = 0.0f;
    size_t rows = 0, counted = 0, agree = 0;  // counted: rows with reference margin > kMargin
    void add(const float *got, const float *ref, size_t V, float margin) {
        for (size_t i = 0; i < V; ++i) max_abs = std::max(max_abs, std::fabs(got[i] - ref[i]));
        ++rows;
        if (margin > kMargin) {
            ++counted;
            agree += argmax_of(got, V) == argmax_of(ref, V);
        }
    }
    double agreement() const { return counted ? double(agree) / double(counted) : 1.0; }
};

// Every prompt position (one decode step each) and the greedy trace of every v2 prompt.
Err fast_v2(const std::string &name) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
    const needle_model_params p = fast_params();
    const Model m = load(model_path(name), &p);
    const size_t V = info_of(m.get()).vocab_size;
    const State s = new_state(m.get());
    std::vector<float> logits(V);
    Err e;
    for (const auto &pr : man["prompts"]) {
        const std::vector<uint32_t> ids = pr["ids"];
        const std::vector<float> full = fixtures::read_f32(fixtures::v2(pr["full"]["file"]));
        const std::vector<float> dec = fixtures::read_f32(fixtures::v2(pr["decode"]["file"]));
        const std::vector<uint32_t> dec_in = pr["decode"]["input_ids"];
        needle_state_reset(s.get());
        for (size_t i = 0; i < ids.size(); ++i) {
            REQUIRE(needle_state_decode(s.get(), ids[i], logits.data(), V) == NEEDLE_OK);
            e.add(logits.data(), full.data() + i * V, V, margin_of(full.data() + i * V, V));
        }
        for (size_t i = 0; i < dec_in.size(); ++i) {
            REQUIRE(needle_state_decode(s.get(), dec_in[i], logits.data(), V) == NEEDLE_OK);
            e.add(logits.data(), dec.data() + i * V, V, margin_of(dec.data() + i * V, V));
        }
    }
    MESSAGE(name << " FAST: max |dlogit| " << e.max_abs << ", argmax agreement " << e.agree << "/" << e.counted
                 << " rows with margin > 0.1 (" << e.rows << " rows)");
    return e;
}

std::vector<uint32_t> read_u32(const std::string &path) {
    const std::vector<uint8_t> b = fixtures::read_bytes(path);
    std::vector<uint32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

// Every f32-KV manifest case of a v3 model (prefill row + decode rows), at its depth.
Err fast_v3(const std::string &name) {
    const auto man = fixtures::read_json(fixtures::v3("manifest.json"));
    Err e;
    for (const auto &c : man["cases"]) {
        if (c["model"] != name || c["kv"] != "f32") continue;
        const needle_model_params p = fast_params(c["depth"]);
        const Model m = load(fixtures::v3("models/" + name + ".cact"), &p);
        const size_t V = c["rows"];
        const std::vector<uint32_t> prompt = read_u32(fixtures::v3(c["prompt_file"]));
        const std::vector<float> pre = fixtures::read_f32(fixtures::v3(c["prefill_logits"]));
        const std::vector<float> dec = fixtures::read_f32(fixtures::v3(c["decode_logits"]));
        const std::vector<uint32_t> fed = c["fed_ids"];
        const std::vector<float> margins = c["argmax_margins"];
        const State s = new_state(m.get());
        const Batch b = new_batch(m.get(), 64);
        std::vector<float> logits(V);
        REQUIRE(needle_state_prefill(s.get(), b.get(), prompt.data(), prompt.size(), logits.data(), V) == NEEDLE_OK);
        e.add(logits.data(), pre.data(), V, margins[0]);
        for (size_t i = 0; i < fed.size(); ++i) {
            REQUIRE(needle_state_decode(s.get(), fed[i], logits.data(), V) == NEEDLE_OK);
            e.add(logits.data(), dec.data() + i * V, V, margins[i + 1]);
        }
    }
    MESSAGE(name << " FAST: max |dlogit| " << e.max_abs << ", argmax agreement " << e.agree << "/" << e.counted
                 << " rows with margin > 0.1 (" << e.rows << " rows)");
    return e;
}

void check(const Err &e, float bound) {
    CHECK(e.rows > 0);
    CHECK(e.counted > 0);
    CHECK(e.max_abs <= bound);
    CHECK(e.agreement() >= 0.99);
}

// Batched prefill (chunks of `chunk`) == sequential decode steps, bit for bit, in FAST, for
// prefixes of every prompt.
void fast_batched(const std::string &name, uint32_t chunk) {
    const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
    const needle_model_params p = fast_params();
    const Model m = load(model_path(name), &p);
    const size_t V = info_of(m.get()).vocab_size;
    const State s = new_state(m.get()), t = new_state(m.get());
    const Batch b = new_batch(m.get(), chunk);
    std::vector<float> seq(V), bat(V);
    int compared = 0;
    for (const auto &pr : man["prompts"]) {
        const std::vector<uint32_t> ids = pr["ids"];
        for (size_t len : {size_t(1), size_t(chunk + 3), ids.size()}) {
            if (len > ids.size()) continue;
            needle_state_reset(s.get());
            for (size_t i = 0; i < len; ++i) REQUIRE(needle_state_decode(s.get(), ids[i], seq.data(), V) == NEEDLE_OK);
            needle_state_reset(t.get());
            REQUIRE(needle_state_prefill(t.get(), b.get(), ids.data(), len, bat.data(), V) == NEEDLE_OK);
            INFO(name << " prefix " << len);
            CHECK(std::memcmp(seq.data(), bat.data(), V * sizeof(float)) == 0);
            ++compared;
        }
    }
    CHECK(compared > 0);
}

// A random CQ matrix (ternary: width 2 with the book {0, +a, 0, -a} by crumb) in stored form.
struct RandomCq {
    std::vector<uint8_t> packed;
    std::vector<float> norms, levels;
    needle::CqMatrix m;
    RandomCq(std::mt19937 &rng, uint32_t rows, uint32_t cols, uint32_t group, uint32_t width, bool ternary) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        m.rows = rows, m.cols = cols, m.group = group, m.ngroups = (cols + group - 1) / group;
        m.cols_pad = m.ngroups * group, m.width = width, m.row_bytes = m.cols_pad * width / 8;
        packed.resize(size_t(rows) * m.row_bytes);
        for (uint8_t &b : packed) b = uint8_t(rng());
        if (ternary)
            for (uint8_t &b : packed)  // crumb 2 is not a ternary code
                for (int k = 0; k < 4; ++k)
                    if (((b >> (2 * k)) & 3) == 2) b = uint8_t(b ^ (1 << (2 * k)));
        for (uint32_t i = 0; i < rows * m.ngroups; ++i) norms.push_back(0.5f * nd(rng));
        for (uint32_t i = 0; i < (1u << width); ++i) levels.push_back(0.1f * nd(rng));
        if (ternary) levels = {0.0f, 0.1f, 0.0f, -0.1f};
        m.packed = packed.data(), m.norms = norms.data(), m.levels = levels.data(), m.fast = true;
    }
};

}  // namespace

// Kernel level: each ISA's FAST quantisation and matmul (its rows-in-lanes copy when it has one)
// give the scalar reference's bits, for one position and for many; the model level inherits
// that for the matmuls (the rest of a forward pass differs across ISAs by rounding, which an
// int8 rounding step can amplify, so whole-model logits are compared with the references above).
TEST_CASE("fast: every kernel ISA gives the scalar FAST bits (quantisation and matmul)") {
    struct Case { uint32_t width; bool ternary; uint32_t group, cols, rows; };
    const Case cases[] = {{2, false, 128, 300, 37}, {2, true, 128, 256, 16}, {2, false, 8, 40, 9},
                          {2, false, 64, 200, 20},  {3, false, 32, 45, 7},   {3, false, 128, 300, 17},
                          {4, false, 64, 100, 11},  {4, false, 128, 512, 33}, {4, false, 256, 256, 4}};
    const std::string initial = needle_kernel_isa();
    int compared = 0;
    for (const char *isa : {"sse4_2", "avx2", "avx512", "neon"}) {
        if (!needle::use_kernel_isa(isa)) continue;
        const needle::KernelTable &k = needle::active_kernels();
        std::mt19937 rng(7);
        for (const Case &c : cases) {
            INFO(isa << " width " << c.width << (c.ternary ? " (ternary)" : "") << " group " << c.group << " cols "
                     << c.cols << " rows " << c.rows);
            RandomCq w(rng, c.rows, c.cols, c.group, c.width, c.ternary);
            needle::CqBlockStore store;
            needle::CqMatrix *mp = &w.m;
            needle::cq_block_matrices(&mp, 1, store);  // this ISA's copy (none for stored-form ISAs)
            const uint32_t P = 9, xs = w.m.cols_pad + 5, ng = w.m.ngroups;
            std::normal_distribution<float> nd(0.0f, 1.0f);
            std::vector<float> xh(size_t(P) * xs);
            for (float &v : xh) v = nd(rng);
            const size_t s2 = size_t(ng) * needle::cq_fast_group_bytes(c.group, 2);
            const size_t s4 = size_t(ng) * needle::cq_fast_group_bytes(c.group, 4);
            std::vector<int8_t> q2a(P * s2), q4a(P * s4), q2b(P * s2), q4b(P * s4);
            std::vector<float> sa(P * ng), sb(P * ng);
            std::vector<int32_t> ua(P * ng), ub(P * ng);
            k.cq_fast_quantize(xh.data(), xs, P, w.m.cols_pad, c.group, q2a.data(), s2, q4a.data(), s4, sa.data(), ua.data());
            needle::scalar::cq_fast_quantize(xh.data(), xs, P, w.m.cols_pad, c.group, q2b.data(), s2, q4b.data(), s4,
                                             sb.data(), ub.data());
            CHECK(q2a == q2b);
            CHECK(q4a == q4b);
            CHECK(std::memcmp(sa.data(), sb.data(), sa.size() * 4) == 0);
            CHECK(ua == ub);
            needle::CqFastInput in;
            in.q2 = q2b.data(), in.q4 = q4b.data(), in.q2_stride = s2, in.q4_stride = s4;
            in.scale = sb.data(), in.sum = ub.data(), in.ngroups = ng;
            const uint32_t r0 = 1, count = c.rows - 1, ys = c.rows + 2;
            std::vector<float> got(size_t(P) * ys, 7.0f), want(size_t(P) * ys, 7.0f), one(size_t(P) * ys, 7.0f);
            k.cq_matmul_fast(w.m, in, P, r0, count, got.data(), ys);
            needle::scalar::cq_matmul_fast(w.m, in, P, r0, count, want.data(), ys);
            CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
            for (uint32_t p = 0; p < P; ++p) {  // one position at a time: the same bits
                needle::CqFastInput ip = in;
                ip.q2 += p * s2, ip.q4 += p * s4, ip.scale += p * ng, ip.sum += p * ng;
                k.cq_matmul_fast(w.m, ip, 1, r0, count, one.data() + size_t(p) * ys, ys);
            }
            CHECK(std::memcmp(one.data(), want.data(), one.size() * 4) == 0);
            float mx = 0.0f;
            for (float v : want) mx = std::max(mx, std::fabs(v));
            CHECK(mx > 0.0f);  // not all zero
        }
        ++compared;
    }
    MESSAGE(compared << " vector ISAs compared with the scalar FAST reference");
    needle::use_kernel_isa(initial.c_str());
}

// Bounds: the measured max |dlogit| (x86-64, every ISA gives the same bits), rounded up.
// Measured (x86-64 AVX-512 VNNI): tiny 0.199, odd 0.115, ternary 0.141, needle2 0.136, tiny3
// 0.060, needle3syn 0.055; argmax agreement 100% of the rows with margin > 0.1 on every model.
// The aim of 5e-2 is missed by up to 4x on v2 (README, "Fast numerics").
TEST_CASE("fast: logits v2: tiny") { check(fast_v2("tiny"), 0.22f); }
TEST_CASE("fast: logits v2: odd") { check(fast_v2("odd"), 0.13f); }
TEST_CASE("fast: logits v2: ternary") { check(fast_v2("ternary"), 0.16f); }
TEST_CASE("fast: logits v2: needle2") { check(fast_v2("needle2"), 0.15f); }
TEST_CASE("fast: logits v3: tiny3") { check(fast_v3("tiny3"), 0.07f); }
TEST_CASE("fast: logits v3: needle3syn") { check(fast_v3("needle3syn"), 0.065f); }

TEST_CASE("fast: batched == sequential: tiny, odd, ternary") {
    fast_batched("tiny", 16);
    fast_batched("odd", 7);
    fast_batched("ternary", 16);
}
TEST_CASE("fast: batched == sequential: needle2") { fast_batched("needle2", 32); }

TEST_CASE("fast: precision params (ABI: appended field, defaults, validation)") {
    // init writes precision = EXACT; a struct_size ending at depth leaves the bytes past it alone.
    needle_model_params p;
    std::memset(&p, 0x5a, sizeof p);
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    CHECK(p.precision == NEEDLE_PRECISION_EXACT);
    std::memset(&p, 0x5a, sizeof p);
    p.struct_size = uint32_t(offsetof(needle_model_params, precision));
    needle_model_params_init(&p);
    CHECK(p.depth == 0);
    int32_t untouched;
    std::memset(&untouched, 0x5a, sizeof untouched);
    CHECK(std::memcmp(&p.precision, &untouched, sizeof untouched) == 0);
    // Such a short struct loads EXACT (the garbage past struct_size is not read).
    needle_model *m = nullptr;
    CHECK(needle_model_load_file(model_path("tiny").c_str(), &p, &m) == NEEDLE_OK);
    needle_model_free(m);
    // An unknown precision is refused.
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.precision = 2;
    m = reinterpret_cast<needle_model *>(&p);
    CHECK(needle_model_load_file(model_path("tiny").c_str(), &p, &m) == NEEDLE_E_INVALID_ARGUMENT);
    CHECK(m == nullptr);
    CHECK(std::string(needle_last_error()).find("precision") != std::string::npos);
    // FAST and EXACT of one model differ (the int8 path runs) but stay close.
    const Model exact = load(model_path("tiny"));
    const needle_model_params fp = fast_params();
    const Model fast = load(model_path("tiny"), &fp);
    const size_t V = info_of(exact.get()).vocab_size;
    const State se = new_state(exact.get()), sf = new_state(fast.get());
    std::vector<float> le(V), lf(V);
    REQUIRE(needle_state_decode(se.get(), 2, le.data(), V) == NEEDLE_OK);
    REQUIRE(needle_state_decode(sf.get(), 2, lf.data(), V) == NEEDLE_OK);
    float mx = 0.0f;
    for (size_t i = 0; i < V; ++i) mx = std::max(mx, std::fabs(le[i] - lf[i]));
    CHECK(mx > 0.0f);
    CHECK(mx < 0.22f);
}
