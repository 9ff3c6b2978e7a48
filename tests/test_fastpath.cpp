// Tests of the fast path (issue #3): batched (chunked) prefill is bit-identical to sequential
// stepping (model-v2.md §6, cq-kernels.md §7.1/§9), results do not depend on the thread count,
// a decode step allocates nothing, and the kernel ISA forced with NEEDLE_FORCE_ISA is the one in use.
//
// This file replaces the global operator new/delete of the whole test binary (which links the
// engine statically), counting calls only while an AllocWatch is active.
#include <doctest/doctest.h>

#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

// ---------------------------------------------------------------- counting operator new/delete

namespace fastpath_alloc {

std::atomic<bool> g_active{false};
std::atomic<long> g_news{0};
std::atomic<long> g_deletes{0};

// The first few counted allocations: size and call stack, for the failure message.
constexpr int kMaxRecords = 4;
constexpr int kMaxFrames = 24;
struct Record {
    size_t size;
    int n_frames;
    void *frames[kMaxFrames];
};
Record g_records[kMaxRecords];
std::atomic<int> g_n_records{0};

inline void note_new(size_t size) {
    if (!g_active.load(std::memory_order_relaxed)) return;
    g_news.fetch_add(1, std::memory_order_relaxed);
    const int i = g_n_records.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxRecords) {
        g_records[i].size = size;
        g_records[i].n_frames = backtrace(g_records[i].frames, kMaxFrames);  // calls no operator new
    }
}
inline void note_delete(void *p) {
    if (p && g_active.load(std::memory_order_relaxed)) g_deletes.fetch_add(1, std::memory_order_relaxed);
}

inline void *alloc(size_t size) {
    note_new(size);
    return std::malloc(size ? size : 1);
}
inline void *alloc_aligned(size_t size, std::align_val_t al) {
    note_new(size);
    size_t a = static_cast<size_t>(al);
    if (a < sizeof(void *)) a = sizeof(void *);
    void *p = nullptr;
    if (posix_memalign(&p, a, size ? size : 1) != 0) return nullptr;
    return p;
}
inline void release(void *p) {
    note_delete(p);
    std::free(p);
}

}  // namespace fastpath_alloc

void *operator new(size_t n) {
    void *p = fastpath_alloc::alloc(n);
    if (!p) throw std::bad_alloc();
    return p;
}
void *operator new[](size_t n) {
    void *p = fastpath_alloc::alloc(n);
    if (!p) throw std::bad_alloc();
    return p;
}
void *operator new(size_t n, const std::nothrow_t &) noexcept { return fastpath_alloc::alloc(n); }
void *operator new[](size_t n, const std::nothrow_t &) noexcept { return fastpath_alloc::alloc(n); }
void *operator new(size_t n, std::align_val_t a) {
    void *p = fastpath_alloc::alloc_aligned(n, a);
    if (!p) throw std::bad_alloc();
    return p;
}
void *operator new[](size_t n, std::align_val_t a) {
    void *p = fastpath_alloc::alloc_aligned(n, a);
    if (!p) throw std::bad_alloc();
    return p;
}
void *operator new(size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
    return fastpath_alloc::alloc_aligned(n, a);
}
void *operator new[](size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
    return fastpath_alloc::alloc_aligned(n, a);
}
void operator delete(void *p) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p) noexcept { fastpath_alloc::release(p); }
void operator delete(void *p, size_t) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p, size_t) noexcept { fastpath_alloc::release(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { fastpath_alloc::release(p); }
void operator delete(void *p, std::align_val_t) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p, std::align_val_t) noexcept { fastpath_alloc::release(p); }
void operator delete(void *p, size_t, std::align_val_t) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p, size_t, std::align_val_t) noexcept { fastpath_alloc::release(p); }
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { fastpath_alloc::release(p); }
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { fastpath_alloc::release(p); }

namespace {

// "function at file:line" of a code address (engine symbols are hidden, so ask addr2line).
std::string symbolize(void *addr) {
    Dl_info di;
    std::ostringstream os;
    if (!dladdr(addr, &di) || !di.dli_fname) {
        os << addr;
        return os.str();
    }
    const uintptr_t off = reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(di.dli_fbase) - 1;
    os << "addr2line -Cfpe '" << di.dli_fname << "' 0x" << std::hex << off << " 2>/dev/null";
    std::string line;
    if (FILE *f = popen(os.str().c_str(), "r")) {
        char buf[1024];
        while (fgets(buf, sizeof buf, f)) line += buf;
        pclose(f);
    }
    while (!line.empty() && line.back() == '\n') line.pop_back();
    std::ostringstream out;
    out << di.dli_fname << "+0x" << std::hex << off << ": " << (line.empty() ? "?" : line);
    return out.str();
}

// Counts operator new/delete calls (any thread, TBB workers included) between start() and stop().
// Nothing in between may use doctest macros or anything else that allocates.
struct AllocWatch {
    long news = 0, deletes = 0;
    AllocWatch() {
        void *warm[2];
        backtrace(warm, 2);  // loads libgcc's unwinder now, not inside the window
    }
    void start() {
        fastpath_alloc::g_news = 0;
        fastpath_alloc::g_deletes = 0;
        fastpath_alloc::g_n_records = 0;
        fastpath_alloc::g_active = true;
    }
    void stop() {
        fastpath_alloc::g_active = false;
        news = fastpath_alloc::g_news;
        deletes = fastpath_alloc::g_deletes;
    }
    // Sizes and stacks of the first counted allocations.
    static std::string report() {
        std::ostringstream os;
        const int n = std::min<int>(fastpath_alloc::g_n_records, fastpath_alloc::kMaxRecords);
        for (int i = 0; i < n; ++i) {
            const auto &r = fastpath_alloc::g_records[i];
            os << "allocation " << i << ": " << r.size << " bytes\n";
            for (int f = 0; f < r.n_frames; ++f) os << "    " << symbolize(r.frames[f]) << "\n";
        }
        return os.str();
    }
};

// ---------------------------------------------------------------- helpers

using api_test::Batch;  // owning handles (api_util.h)
using api_test::Model;
using api_test::State;

Model load(const std::string &name, int n_threads = 0) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    needle_model *m = nullptr;
    const std::string path = fixtures::v2("models/" + name + ".cact");
    const needle_status st = needle_model_load_file(path.c_str(), &p, &m);
    INFO("loading " << path << ": " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(m != nullptr);
    return Model(m);
}

State new_state(needle_model *m, int32_t kv_window = -1) {
    needle_state_params p;
    p.struct_size = sizeof p;
    needle_state_params_init(&p);
    p.kv_window = kv_window;
    needle_state *s = nullptr;
    const needle_status st = needle_state_create_ex(m, &p, &s);
    INFO("state kv_window " << kv_window << ": " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(s != nullptr);
    return State(s);
}

Batch new_batch(needle_model *m, uint32_t capacity) {
    needle_batch *b = nullptr;
    const needle_status st = needle_batch_create(m, capacity, &b);
    INFO("batch capacity " << capacity << ": " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(b != nullptr);
    return Batch(b);
}

needle_model_info info_of(const needle_model *m) {
    needle_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    REQUIRE(needle_model_get_info(m, &info) == NEEDLE_OK);
    return info;
}

// BOS (2) then deterministic pseudo-random ids in [14, vocab) (splitmix64 of seed and index).
std::vector<uint32_t> prompt_ids(size_t n, uint32_t vocab, uint64_t seed) {
    std::vector<uint32_t> ids(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + n;
    for (size_t i = 0; i < n; ++i) {
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        ids[i] = 14u + uint32_t(z % (vocab - 14u));
    }
    if (n) ids[0] = 2u;
    return ids;
}

uint64_t fnv1a(const std::string &s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
    return h;
}

uint32_t argmax(const std::vector<float> &v) {
    return uint32_t(std::max_element(v.begin(), v.end()) - v.begin());  // first maximum = lowest id
}

// "" when bitwise equal, else where and by how much they differ.
std::string bit_diff(const std::vector<float> &a, const std::vector<float> &b) {
    if (a.size() != b.size()) return "sizes differ";
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) return "";
    size_t n = 0, first = a.size();
    float mx = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (first == a.size()) first = i;
            ++n;
            mx = std::max(mx, std::fabs(a[i] - b[i]));
        }
    }
    std::ostringstream os;
    os.precision(9);
    os << n << " of " << a.size() << " logits differ, first at " << first << " (" << a[first] << " vs "
       << b[first] << "), max |d| " << mx;
    return os.str();
}

// Final prefill logits plus the logits of `steps` decode steps feeding `feed` (the reference's
// greedy tokens; empty = greedy from this run's own logits, i.e. the reference run itself).
struct Trace {
    std::vector<std::vector<float>> logits;  // [0] = prefill, [1..] = decode steps
    std::vector<uint32_t> tokens;            // fed decode tokens
    uint32_t pos_after_prefill = 0;
};

// How the prompt is fed: `split` > 0 feeds the first `split` tokens in a first call (no logits),
// then the rest; `decode_first` > 0 steps the first tokens one by one with needle_state_decode.
struct Feed {
    needle_batch *batch = nullptr;  // NULL = sequential
    size_t split = 0;
    size_t decode_first = 0;
};

Trace run(needle_state *s, const Feed &f, const std::vector<uint32_t> &ids, size_t V, int steps,
          const std::vector<uint32_t> &feed_tokens) {
    Trace t;
    needle_state_reset(s);
    REQUIRE(needle_state_pos(s) == 0);
    std::vector<float> lg(V, -12345.0f);
    size_t i = 0;
    for (; i < f.decode_first && i + 1 < ids.size(); ++i)
        REQUIRE(needle_state_decode(s, ids[i], nullptr, 0) == NEEDLE_OK);
    if (f.split > i && f.split < ids.size()) {
        const needle_status st = needle_state_prefill(s, f.batch, ids.data() + i, f.split - i, nullptr, 0);
        INFO("prefill (first part): " << needle_last_error());
        REQUIRE(st == NEEDLE_OK);
        i = f.split;
    }
    const needle_status st = needle_state_prefill(s, f.batch, ids.data() + i, ids.size() - i, lg.data(), V);
    INFO("prefill: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    t.pos_after_prefill = needle_state_pos(s);
    t.logits.push_back(lg);
    for (int k = 0; k < steps; ++k) {
        const uint32_t tok = feed_tokens.empty() ? argmax(t.logits.back()) : feed_tokens[size_t(k)];
        t.tokens.push_back(tok);
        std::fill(lg.begin(), lg.end(), -12345.0f);
        INFO("decode step " << k << ": " << needle_last_error());
        REQUIRE(needle_state_decode(s, tok, lg.data(), V) == NEEDLE_OK);
        t.logits.push_back(lg);
    }
    return t;
}

// Compares a trace with the sequential reference: final prefill logits and every decode step.
void expect_same(const Trace &ref, const Trace &got, const std::string &what) {
    INFO(what);
    CHECK(got.pos_after_prefill == ref.pos_after_prefill);
    REQUIRE(got.logits.size() == ref.logits.size());
    for (size_t k = 0; k < ref.logits.size(); ++k) {
        const std::string d = bit_diff(ref.logits[k], got.logits[k]);
        INFO((k == 0 ? std::string("final prefill logits") : "decode step " + std::to_string(k - 1)) << ": " << d);
        CHECK(d.empty());
        // The greedy token chosen from these logits must match too.
        CHECK(argmax(got.logits[k]) == argmax(ref.logits[k]));
    }
}

struct Plan {
    std::vector<size_t> lengths;
    std::vector<uint32_t> capacities;  // plus one larger than each prompt, added per length
    bool extra_feeds = true;           // split calls and decode-then-prefill
    int32_t kv_window = -1;
    bool add_big = true;  // also a capacity of prompt length + 17 (capped at max_seq_len)
};

void batched_vs_sequential(const std::string &name, const Plan &plan) {
    Model m = load(name);
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    MESSAGE(name << ": kv_window " << info.kv_window << " (state window " << plan.kv_window << "), max_seq_len "
                 << info.max_seq_len << ", ISA " << std::string(needle_kernel_isa()));
    State seq_state = new_state(m.get(), plan.kv_window);
    State bat_state = new_state(m.get(), plan.kv_window);
    // Batches are made once and reused for every prompt (a batch may serve any state).
    std::vector<std::pair<uint32_t, Batch>> batches;
    for (uint32_t c : plan.capacities) batches.emplace_back(c, new_batch(m.get(), c));

    for (size_t n : plan.lengths) {
        REQUIRE(n <= info.max_seq_len);
        const int steps = int(std::min<size_t>(8, info.max_seq_len - n));
        const std::vector<uint32_t> ids = prompt_ids(n, info.vocab_size, fnv1a(name));
        std::ostringstream times;  // wall time of each run (prefill + decode steps)
        auto timed = [&](const std::string &label, auto &&fn) {
            const auto t0 = std::chrono::steady_clock::now();
            Trace t = fn();
            times << " " << label << " "
                  << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
                  << " ms;";
            return t;
        };
        const Trace ref = timed("sequential", [&] { return run(seq_state.get(), Feed{}, ids, V, steps, {}); });
        REQUIRE(ref.pos_after_prefill == n);

        // One batch larger than the whole prompt.
        std::vector<std::pair<uint32_t, needle_batch *>> caps;
        for (auto &b : batches) caps.emplace_back(b.first, b.second.get());
        Batch big_batch;
        const uint32_t big = uint32_t(std::min<size_t>(info.max_seq_len, n + 17));
        if (plan.add_big && std::find(plan.capacities.begin(), plan.capacities.end(), big) == plan.capacities.end()) {
            REQUIRE(big > n);
            big_batch = new_batch(m.get(), big);
            caps.emplace_back(big, big_batch.get());
        }

        for (const auto &c : caps) {
            std::ostringstream what;
            what << name << ": prompt length " << n << ", batch capacity " << c.first << ", window "
                 << (plan.kv_window < 0 ? int64_t(info.kv_window) : int64_t(plan.kv_window));
            const Trace got = timed("cap " + std::to_string(c.first),
                                    [&] { return run(bat_state.get(), Feed{c.second}, ids, V, steps, ref.tokens); });
            expect_same(ref, got, what.str());
        }
        MESSAGE(name << " prompt " << n << " + " << steps << " decode steps:" << times.str());
        if (plan.extra_feeds && n >= 4) {
            // The split feeds run at capacity 16: the plan's batch of 16, else one of its own
            // (a plan need not list 16).
            needle_batch *b16 = nullptr;
            for (auto &b : batches)
                if (b.first == 16) b16 = b.second.get();
            Batch own16;
            if (!b16) {
                own16 = new_batch(m.get(), 16);
                b16 = own16.get();
            }
            REQUIRE(b16 != nullptr);
            const size_t half = n / 2 + 1;
            std::ostringstream w1, w2, w3;
            w1 << name << ": prompt length " << n << ", two prefill calls split at " << half << ", capacity 16";
            expect_same(ref, run(bat_state.get(), Feed{b16, half, 0}, ids, V, steps, ref.tokens), w1.str());
            w2 << name << ": prompt length " << n << ", 3 decode steps then prefill, capacity 16";
            expect_same(ref, run(bat_state.get(), Feed{b16, 0, 3}, ids, V, steps, ref.tokens), w2.str());
            w3 << name << ": prompt length " << n << ", two sequential (NULL batch) prefill calls split at " << half;
            expect_same(ref, run(bat_state.get(), Feed{nullptr, half, 0}, ids, V, steps, ref.tokens), w3.str());
        }
    }
}

// Chunk sizes for the small models: 1, sizes dividing nothing, around the window of 48, 128.
const std::vector<uint32_t> kSmallCaps{1, 2, 3, 5, 7, 16, 47, 48, 49, 64, 128};

// The ISA the dispatcher should pick on this CPU (best first), mirroring dispatch.cpp's checks.
bool isa_supported(const std::string &isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (isa == "avx512")
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == "sse4_2") return __builtin_cpu_supports("sse4.2");
#endif
#if defined(__aarch64__)
    if (isa == "neon") return true;  // baseline on aarch64
#endif
    return isa == "scalar";
}

std::string best_isa() {
#if defined(__x86_64__) || defined(__i386__)
    for (const char *isa : {"avx512", "avx2", "sse4_2"})
        if (isa_supported(isa)) return isa;
#endif
#if defined(__aarch64__)
    return "neon";
#else
    return "scalar";
#endif
}

}  // namespace

// ---------------------------------------------------------------- 1. batched == sequential

TEST_CASE("fastpath: batched == sequential: tiny") {
    batched_vs_sequential("tiny", Plan{{1, 2, 47, 48, 49, 97, 150}, kSmallCaps});
}

TEST_CASE("fastpath: batched == sequential: tiny window overrides") {
    // Full causal (ring of max_seq_len) and windows far smaller than the chunks (rings of 5 and 1
    // slots, so writing a chunk's keys before attending would overwrite keys still in the window).
    batched_vs_sequential("tiny", Plan{{49, 150}, {1, 3, 16, 128}, false, 0});
    batched_vs_sequential("tiny", Plan{{49, 150}, {1, 3, 16, 128}, false, 5});
    batched_vs_sequential("tiny", Plan{{49, 150}, {1, 3, 16, 128}, false, 1});
}

TEST_CASE("fastpath: batched == sequential: odd") {
    // Window 0 = full causal; max_seq_len 256, so 248 leaves room for the 8 decode steps;
    // 250 fills the context to the last position with 6 steps. Capacity 256 = max_seq_len.
    batched_vs_sequential("odd", Plan{{1, 2, 100, 248, 250}, {1, 2, 3, 7, 16, 64, 128, 256}});
}

TEST_CASE("fastpath: batched == sequential: ternary") {
    batched_vs_sequential("ternary", Plan{{1, 2, 47, 48, 49, 97, 150}, kSmallCaps});
}

TEST_CASE("fastpath: batched == sequential: needle2") {
    // Window 256: 300 and 600 are past it; 7 and 128 divide neither; 700 is larger than both.
    batched_vs_sequential("needle2", Plan{{300, 600}, {7, 128, 700}, false, -1, false});
}

// ---------------------------------------------------------------- 2. thread count

namespace {
void threads_equal(const std::string &name, size_t n) {
    Model m1 = load(name, 1);
    Model m2 = load(name, 2);
    const needle_model_info info = info_of(m1.get());
    const size_t V = info.vocab_size;
    const std::vector<uint32_t> ids = prompt_ids(n, info.vocab_size, 77);
    State s1 = new_state(m1.get());
    State s2 = new_state(m2.get());
    Batch b1 = new_batch(m1.get(), 64);
    Batch b2 = new_batch(m2.get(), 64);
    const Trace t1 = run(s1.get(), Feed{b1.get()}, ids, V, 8, {});
    const Trace t2 = run(s2.get(), Feed{b2.get()}, ids, V, 8, t1.tokens);
    expect_same(t1, t2, name + ": n_threads 1 vs 2, prompt length " + std::to_string(n) + ", batch capacity 64");
    // And against the sequential pass of the 2-thread model.
    const Trace t3 = run(s2.get(), Feed{}, ids, V, 8, t1.tokens);
    expect_same(t1, t3, name + ": n_threads 1 batched vs n_threads 2 sequential, prompt length " + std::to_string(n));
}
}  // namespace

TEST_CASE("fastpath: n_threads 1 == n_threads 2: tiny") { threads_equal("tiny", 150); }
TEST_CASE("fastpath: n_threads 1 == n_threads 2: needle2") { threads_equal("needle2", 300); }

// ---------------------------------------------------------------- 3. no allocation

namespace {
void no_alloc(const std::string &name, size_t prompt_len, uint32_t capacity) {
    Model m = load(name);
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    State s = new_state(m.get());
    Batch b = new_batch(m.get(), capacity);
    const std::vector<uint32_t> ids = prompt_ids(prompt_len, info.vocab_size, 5);
    std::vector<float> lg(V);
    AllocWatch w;

    // Warm-up: a batched prefill and a few decodes.
    REQUIRE(needle_state_prefill(s.get(), b.get(), ids.data(), ids.size(), lg.data(), V) == NEEDLE_OK);
    for (int i = 0; i < 4; ++i) REQUIRE(needle_state_decode(s.get(), argmax(lg), lg.data(), V) == NEEDLE_OK);
    REQUIRE(needle_state_decode(s.get(), 20, nullptr, 0) == NEEDLE_OK);

    SUBCASE("32 decode steps") {
        needle_status st[32];
        w.start();
        for (int i = 0; i < 32; ++i)
            st[i] = (i % 2 == 0) ? needle_state_decode(s.get(), 14u + uint32_t(i), lg.data(), V)
                                 : needle_state_decode(s.get(), 14u + uint32_t(i), nullptr, 0);
        w.stop();
        for (int i = 0; i < 32; ++i) REQUIRE(st[i] == NEEDLE_OK);
        INFO(name << ": operator new calls in 32 decode steps: " << w.news << ", delete calls: " << w.deletes
                  << "\n" << AllocWatch::report());
        CHECK(w.news == 0);
        CHECK(w.deletes == 0);
    }
    SUBCASE("needle_decode_many of 3 states, 8 steps") {
        State s1 = new_state(m.get()), s2 = new_state(m.get());
        REQUIRE(needle_state_prefill(s1.get(), b.get(), ids.data(), 7, nullptr, 0) == NEEDLE_OK);
        needle_state *st3[] = {s.get(), s1.get(), s2.get()};
        std::vector<float> l1(V), l2(V);
        float *outs[] = {lg.data(), l1.data(), l2.data()};
        const uint32_t toks[] = {15, 16, 17};
        REQUIRE(needle_decode_many(st3, toks, 3, outs, V, b.get()) == NEEDLE_OK);  // warm-up
        needle_status st[8];
        w.start();
        for (int i = 0; i < 8; ++i)
            st[i] = needle_decode_many(st3, toks, 3 - uint32_t(i % 2), i % 3 ? outs : nullptr, i % 3 ? V : 0, b.get());
        w.stop();
        for (needle_status x : st) REQUIRE(x == NEEDLE_OK);
        INFO(name << ": operator new calls in 8 decode_many steps: " << w.news << ", delete calls: " << w.deletes
                  << "\n" << AllocWatch::report());
        CHECK(w.news == 0);
        CHECK(w.deletes == 0);
    }
    SUBCASE("batched prefill after the first") {
        needle_status st[3];
        for (int rep = 0; rep < 3; ++rep) {
            needle_state_reset(s.get());
            w.start();
            st[0] = needle_state_prefill(s.get(), b.get(), ids.data(), ids.size(), lg.data(), V);
            st[1] = needle_state_prefill(s.get(), b.get(), ids.data(), 5, nullptr, 0);  // no LM head
            st[2] = needle_state_prefill(s.get(), nullptr, ids.data(), 5, lg.data(), V);  // sequential
            w.stop();
            for (needle_status x : st) REQUIRE(x == NEEDLE_OK);
            INFO(name << ": repetition " << rep << ": operator new calls in 3 prefill calls (" << prompt_len
                      << " tokens, capacity " << capacity << "): " << w.news << ", delete calls: " << w.deletes
                      << "\n" << AllocWatch::report());
            CHECK(w.news == 0);
            CHECK(w.deletes == 0);
        }
    }
}
}  // namespace

TEST_CASE("fastpath: no allocation in decode and prefill: tiny") { no_alloc("tiny", 100, 16); }
TEST_CASE("fastpath: no allocation in decode and prefill: needle2") { no_alloc("needle2", 40, 16); }

TEST_CASE("fastpath: the allocation counter works") {
    // The watch must see an allocation made on purpose, else a 0 above proves nothing.
    AllocWatch w;
    w.start();
    auto *p = new std::vector<int>(100);
    delete p;
    w.stop();
    CHECK(w.news == 2);
    CHECK(w.deletes == 2);
    // And one made inside the engine: creating a batch allocates its scratch.
    Model m = load("tiny");
    needle_batch *b = nullptr;
    w.start();
    const needle_status st = needle_batch_create(m.get(), 8, &b);
    w.stop();
    needle_batch_free(b);
    CHECK(st == NEEDLE_OK);
    CHECK(w.news > 0);
}

// ---------------------------------------------------------------- 4. forced ISA

TEST_CASE("fastpath: forced ISA is active") {
    const char *env = std::getenv("NEEDLE_FORCE_ISA");
    const std::string active = needle_kernel_isa();
    const std::string best = best_isa();
    MESSAGE("NEEDLE_FORCE_ISA=" << std::string(env ? env : "(unset)") << ", active " << active << ", best on this CPU "
                                << best);
    if (!env || !*env) {
        CHECK(active == best);  // unforced: the best the CPU runs
        return;
    }
    const std::string forced = env;
    if (isa_supported(forced)) {
        CHECK(active == forced);
    } else {
        MESSAGE("skipped: this CPU does not run " << forced << " (the dispatcher uses " << active << ")");
        CHECK(active == best);  // needle.h: a forced ISA the CPU cannot run falls back to the best
    }
}
