// Build options (issue 12): the logits are the same bits whatever the thread count, and whether
// the library was built with oneTBB or with NEEDLE_WITH_TBB=OFF (one thread per state).
//
// The cross-build check needs two builds: the one run with NEEDLE_LOGITS_DIGEST_OUT=FILE writes
// one "model digest" line per fixture model; a run with NEEDLE_LOGITS_DIGEST_EXPECT=FILE (the
// other build, same ISA) checks its digests against them. .ci/run does both.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "api_util.h"
#include "core/parallel.h"
#include "needle.h"

using namespace api_test;

namespace {

uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

// FNV-1a of the logits of a 150-token batched prefill (capacity 64, so chunks big enough for
// the worker split) and 8 greedy decode steps, on a model loaded with n_threads.
uint64_t logits_digest(const std::string &name, int n_threads) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    Model m = load(model_path(name), &p);
    const needle_model_info info = info_of(m.get());
    State s = new_state(m.get());
    Batch b = new_batch(m.get(), 64);
    std::vector<uint32_t> ids(150);
    uint32_t x = 12345;
    for (uint32_t &id : ids) {
        x = x * 1103515245u + 12345u;
        id = 4 + (x >> 8) % (info.vocab_size - 4);
    }
    std::vector<float> lg = prefill(s.get(), b.get(), ids, info.vocab_size);
    uint64_t h = fnv1a(0xCBF29CE484222325ull, lg.data(), lg.size() * sizeof(float));
    for (int k = 0; k < 8; ++k) {
        lg = step(s.get(), argmax(lg), info.vocab_size);
        h = fnv1a(h, lg.data(), lg.size() * sizeof(float));
    }
    return h;
}

}  // namespace

TEST_CASE("build: logits bits are the same for n_threads 1 and 4, and across the NEEDLE_WITH_TBB builds") {
    MESSAGE("NEEDLE_WITH_TBB=" << needle::kThreaded << ", kernels " << std::string(needle_kernel_isa()));
    std::map<std::string, uint64_t> got;
    for (const char *name : {"tiny", "odd", "ternary"}) {
        const uint64_t one = logits_digest(name, 1);
        const uint64_t four = logits_digest(name, 4);  // without TBB: accepted and ignored
        INFO(name);
        CHECK(one == four);
        got[name] = one;
    }
    if (const char *out = std::getenv("NEEDLE_LOGITS_DIGEST_OUT")) {
        std::ofstream f(out);
        for (const auto &kv : got) f << kv.first << ' ' << kv.second << '\n';
        REQUIRE(f.good());
    }
    if (const char *in = std::getenv("NEEDLE_LOGITS_DIGEST_EXPECT")) {
        std::ifstream f(in);
        REQUIRE(f.good());
        std::map<std::string, uint64_t> want;
        std::string name;
        uint64_t d = 0;
        while (f >> name >> d) want[name] = d;
        CHECK(want == got);
    }
}
