// API misuse and lifetimes beyond tests/test_api.cpp: lengths at SIZE_MAX that the API can
// reject without reading past the caller's buffer, buffers that claim more room than needed,
// sequences filled to exactly max_seq_len through a full-size batch, batches of an identical but
// distinct model, and 1,000 create/free cycles of models (from memory, including failed loads),
// states and batches with flat memory.
#include <doctest/doctest.h>

#include <malloc.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api_util.h"
#include "cact_writer.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

// Bytes the process holds from malloc (heap chunks in use + mmapped chunks): exact, unlike RSS,
// which also counts freed heap that glibc has not returned to the system.
size_t malloc_in_use() {
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

size_t rss_bytes() {
    std::FILE *f = std::fopen("/proc/self/statm", "r");
    REQUIRE(f != nullptr);
    unsigned long size = 0, resident = 0;
    const int got = std::fscanf(f, "%lu %lu", &size, &resident);
    std::fclose(f);
    REQUIRE(got == 2);
    return size_t(resident) * 4096;
}

std::vector<uint8_t> file_bytes(const std::string &name) { return fixtures::read_bytes(model_path(name)); }

void put_u32(std::vector<uint8_t> &b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[off + size_t(i)] = uint8_t(v >> (8 * i));
}

}  // namespace

TEST_CASE("misuse: flags other than 0 or 1 and short params name the field") {
    needle_model_params mp;
    mp.struct_size = sizeof mp;
    needle_model_params_init(&mp);
    mp.use_mmap = 5;  // more likely a misplaced field than "on"
    needle_model *raw = nullptr;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(model_path("tiny").c_str(), &mp, &raw),
                "use_mmap 5");
    CHECK(raw == nullptr);

    Model m = load(model_path("tiny"));
    const char *fields[] = {"grammar", "require_required", "stop_needs_call", "sinks"};
    for (const char *f : fields) {
        needle_chat_params cp;
        cp.struct_size = sizeof cp;
        needle_chat_params_init(&cp);
        int32_t *field = std::strcmp(f, "grammar") == 0            ? &cp.grammar
                         : std::strcmp(f, "require_required") == 0 ? &cp.require_required
                         : std::strcmp(f, "stop_needs_call") == 0  ? &cp.stop_needs_call
                                                                   : &cp.sinks;
        *field = 7;
        needle_chat *c = nullptr;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_chat_create(m.get(), "", "[]", &cp, &c),
                    (std::string(f) + " 7").c_str());
        CHECK(c == nullptr);
    }

    // A params struct shorter than the library's says "<", not "is not" (a longer one is fine).
    State s = new_state(m.get());
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.struct_size = uint32_t(sizeof gp - 1);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, "hi", 2, &gp, nullptr, nullptr, nullptr),
                ("params.struct_size " + std::to_string(sizeof gp - 1) + " < " + std::to_string(sizeof gp)).c_str());
}

TEST_CASE("misuse: lengths at SIZE_MAX are rejected before the caller's buffer is overrun") {
    Model m = load(model_path("odd"));
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    State s = new_state(m.get());
    Batch b = new_batch(m.get(), 4);
    std::vector<float> lg(V);

    // n_tokens SIZE_MAX: a NULL array is an argument error; otherwise the length fails the room
    // check before any id is read (ASan would report a read past these one-element arrays).
    const uint32_t bad_first[1] = {uint32_t(V) + 7};
    const uint32_t good[1] = {5};
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), nullptr, nullptr, SIZE_MAX, nullptr, 0), "tokens");
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), b.get(), good, SIZE_MAX, lg.data(), V),
                std::to_string(SIZE_MAX).c_str());
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, good, SIZE_MAX, nullptr, 0),
                "max_seq_len");
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, bad_first, SIZE_MAX, nullptr, 0),
                "max_seq_len");
    // Within the room, a bad id is found where it is.
    const uint32_t bad_second[2] = {5, uint32_t(V) + 7};
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), b.get(), bad_second, 2, lg.data(), V),
                "index 1");
    // More valid tokens than room: CONTEXT_FULL.
    const std::vector<uint32_t> too_many(size_t(info.max_seq_len) + 1, 5);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL,
                needle_state_prefill(s.get(), b.get(), too_many.data(), too_many.size(), lg.data(), SIZE_MAX),
                std::to_string(info.max_seq_len).c_str());
    CHECK(needle_state_pos(s.get()) == 0);

    // logits_len SIZE_MAX: only vocab_size floats are written (a guard after them stays).
    std::vector<float> big(V + 16, -7.0f);
    CHECK(needle_state_decode(s.get(), info.bos_id, big.data(), SIZE_MAX) == NEEDLE_OK);
    const uint32_t two[2] = {20, 21};
    CHECK(needle_state_prefill(s.get(), b.get(), two, 2, big.data(), SIZE_MAX) == NEEDLE_OK);
    for (size_t i = V; i < big.size(); ++i) CHECK(big[i] == -7.0f);
    CHECK(needle_state_pos(s.get()) == 3);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5, nullptr, SIZE_MAX), "logits");
    CHECK(needle_state_pos(s.get()) == 3);

    // Tokenizer: NULL with SIZE_MAX lengths; capacities of SIZE_MAX write only what is produced.
    size_t n = 77;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), nullptr, SIZE_MAX, 1, nullptr, 0, &n), "text");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), "ab", 2, 1, nullptr, SIZE_MAX, &n), "tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), nullptr, SIZE_MAX, nullptr, 0, &n), "tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), bad_first, SIZE_MAX, nullptr, 0, &n),
                std::to_string(V + 7).c_str());
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), two, 2, nullptr, SIZE_MAX, &n), "text");
    std::vector<uint32_t> ids(64, 0xABCDu);
    REQUIRE(needle_model_tokenize(m.get(), "Hello there", 11, 1, ids.data(), SIZE_MAX, &n) == NEEDLE_OK);
    REQUIRE(n > 1);
    REQUIRE(n < ids.size());
    for (size_t i = n; i < ids.size(); ++i) CHECK(ids[i] == 0xABCDu);
    std::vector<char> text(256, 'q');
    size_t len = 0;
    REQUIRE(needle_model_detokenize(m.get(), ids.data(), n, text.data(), SIZE_MAX, &len) == NEEDLE_OK);
    CHECK(std::string(text.data(), len) == "Hello there");
    CHECK(text[len] == '\0');
    for (size_t i = len + 1; i < text.size(); ++i) CHECK(text[i] == 'q');

    // Generation with a NULL prompt of SIZE_MAX bytes, and a budget of UINT32_MAX that the
    // context ends: CONTEXT_FULL stops it, not the budget, and the state is full.
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, nullptr, SIZE_MAX, nullptr, nullptr, nullptr, nullptr),
                "prompt");
    CHECK(needle_state_pos(s.get()) == 3);
    needle_state_reset(s.get());
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = UINT32_MAX;
    gp.temperature = 1.0f;  // sampled: EOS may still end it first, which is also a clean stop
    gp.seed = 3;
    needle_generate_result res;
    std::memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    // Fill all but 8 positions first so the run is short.
    std::vector<uint32_t> fill(size_t(info.max_seq_len) - 8, 30);
    REQUIRE(needle_state_prefill(s.get(), nullptr, fill.data(), fill.size(), nullptr, 0) == NEEDLE_OK);
    const needle_status gst = needle_generate(s.get(), b.get(), "a", 1, &gp, nullptr, nullptr, &res);
    CHECK(gst == NEEDLE_OK);
    CHECK((res.stop_reason == NEEDLE_STOP_CONTEXT_FULL || res.stop_reason == NEEDLE_STOP_EOS));
    if (res.stop_reason == NEEDLE_STOP_CONTEXT_FULL) CHECK(needle_state_pos(s.get()) == info.max_seq_len);
    CHECK(needle_state_pos(s.get()) <= info.max_seq_len);
}

TEST_CASE("misuse: a full-size batch fills the sequence to exactly max_seq_len") {
    for (const std::string name : {"odd", "tiny"}) {
        CAPTURE(name);
        Model m = load(model_path(name));
        const needle_model_info info = info_of(m.get());
        const uint32_t T = info.max_seq_len;
        const size_t V = info.vocab_size;
        std::vector<uint32_t> ids(T);
        std::mt19937 rng(11);
        for (uint32_t &t : ids) t = 14 + rng() % (uint32_t(V) - 14);
        // Reference: one token at a time, logits of the last position.
        State ref = new_state(m.get());
        REQUIRE(needle_state_prefill(ref.get(), nullptr, ids.data(), T - 1, nullptr, 0) == NEEDLE_OK);
        const std::vector<float> want = step(ref.get(), ids.back(), V);
        // One chunk of T positions through a batch of capacity T.
        Batch b = new_batch(m.get(), T);
        State s = new_state(m.get());
        CHECK(same_bits(prefill(s.get(), b.get(), ids, V), want));
        CHECK(needle_state_pos(s.get()) == T);
        std::vector<float> lg(V);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), 5, lg.data(), V), std::to_string(T).c_str());
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), b.get(), ids.data(), 1, nullptr, 0),
                    std::to_string(T).c_str());
        needle_generate_params gp;
        gp.struct_size = sizeof gp;
        needle_generate_params_init(&gp);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_generate(s.get(), b.get(), "a", 1, &gp, nullptr, nullptr, nullptr),
                    std::to_string(T).c_str());
        CHECK(needle_state_pos(s.get()) == T);
        // A reset state takes the same chunk again with the same result.
        needle_state_reset(s.get());
        CHECK(same_bits(prefill(s.get(), b.get(), ids, V), want));
        // kv_window INT32_MAX is full causal, like 0.
        needle_state_params sp;
        sp.struct_size = sizeof sp;
        needle_state_params_init(&sp);
        sp.kv_window = INT32_MAX;
        needle_state *wide = nullptr;
        REQUIRE(needle_state_create_ex(m.get(), &sp, &wide) == NEEDLE_OK);
        State wh(wide);
        sp.kv_window = 0;
        needle_state *full = nullptr;
        REQUIRE(needle_state_create_ex(m.get(), &sp, &full) == NEEDLE_OK);
        State fh(full);
        CHECK(same_bits(prefill(wide, b.get(), ids, V), prefill(full, nullptr, ids, V)));
    }
}

TEST_CASE("misuse: a batch of an identical but distinct model is refused") {
    const std::vector<uint8_t> bytes = file_bytes("odd");
    needle_model *a = nullptr, *c = nullptr;
    REQUIRE(needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &a) == NEEDLE_OK);
    REQUIRE(needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &c) == NEEDLE_OK);
    Model ma(a), mc(c);
    State s = new_state(a);
    Batch other = new_batch(c, 4);
    const uint32_t ids[2] = {2, 40};
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), other.get(), ids, 2, nullptr, 0), "batch");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), other.get(), "x", 1, nullptr, nullptr, nullptr, nullptr),
                "batch");
    CHECK(needle_state_pos(s.get()) == 0);
}

namespace {

// Inputs the cycles below load: two good containers and refusals from every stage.
struct CycleInputs {
    std::vector<uint8_t> good, edge;
    std::vector<std::vector<uint8_t>> bad;
    CycleInputs() {
        good = file_bytes("odd");
        edge = needle::writer::write_cact_v2(needle::writer::preset("tiny-edge"), 2);
        bad.push_back(std::vector<uint8_t>(good.begin(), good.begin() + 1000));  // truncated
        bad.push_back(good);
        put_u32(bad.back(), 0, 0x12345678u);  // tag
        bad.push_back(good);
        put_u32(bad.back(), 24, 97);  // d_model vs hada_n
        bad.push_back(good);
        bad.back()[232 + 44 * 5 + 40] = 6;  // bits of an FP16 record
        bad.push_back(good);
        bad.back().push_back(0);  // a trailing byte
        // The tokenizer blob's n_pieces: refused at the very end of the load.
        const uint32_t n = uint32_t(good[4] | good[5] << 8 | good[6] << 16 | uint32_t(good[7]) << 24);
        const size_t rec = 232 + 44 * size_t(n - 1);
        uint64_t off = 0;
        for (int i = 0; i < 8; ++i) off |= uint64_t(good[rec + 20 + size_t(i)]) << (8 * i);
        bad.push_back(good);
        put_u32(bad.back(), size_t(off), 1023);
    }
};

// One cycle: load a model (alternating containers) and fail to load a bad one; make a state and
// a batch, prefill through the batch, free all three in a varying order; then a state and batch
// of the long-lived `keep`. Returns false if any call did not give the expected status.
bool cycle(const CycleInputs &in, const needle_model_params &p, needle_model *keep, int i) {
    bool ok = true;
    needle_model *m = nullptr;
    const std::vector<uint8_t> &src = i % 2 ? in.good : in.edge;
    ok = ok && needle_model_load_memory(src.data(), src.size(), &p, &m) == NEEDLE_OK;
    const auto &b = in.bad[size_t(i) % in.bad.size()];
    needle_model *f = reinterpret_cast<needle_model *>(uintptr_t(1));
    ok = ok && needle_model_load_memory(b.data(), b.size(), &p, &f) == NEEDLE_E_FORMAT && f == nullptr;
    if (!m) return false;
    needle_state *s = nullptr;
    needle_batch *bt = nullptr;
    ok = ok && needle_state_create(m, &s) == NEEDLE_OK;
    ok = ok && needle_batch_create(m, 1 + uint32_t(i % 8), &bt) == NEEDLE_OK;
    const uint32_t ids[3] = {2, 20, 21};
    ok = ok && needle_state_prefill(s, bt, ids, 3, nullptr, 0) == NEEDLE_OK;
    switch (i % 3) {  // states and batches keep the model alive
        case 0: needle_model_free(m), needle_state_free(s), needle_batch_free(bt); break;
        case 1: needle_batch_free(bt), needle_model_free(m), needle_state_free(s); break;
        default: needle_state_free(s), needle_batch_free(bt), needle_model_free(m); break;
    }
    s = nullptr, bt = nullptr;
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.kv_window = i % 4 == 0 ? 0 : -1;
    ok = ok && needle_state_create_ex(keep, &sp, &s) == NEEDLE_OK;
    ok = ok && needle_batch_create(keep, 1 + uint32_t(i % 16), &bt) == NEEDLE_OK;
    const uint32_t two[2] = {2, 99};
    ok = ok && needle_state_prefill(s, bt, two, 2, nullptr, 0) == NEEDLE_OK;
    needle_batch_free(bt);
    needle_state_free(s);
    return ok;
}

// Growth over 1,000 cycles that follow 1,000 warm-up cycles, in bytes.
struct Growth {
    long malloc_bytes;  // bytes in use from malloc: a leak of 16 bytes a cycle shows
    long rss;           // resident set: also catches what malloc does not see (thread stacks, maps)
};

// Why both: RSS alone misled. glibc's heap grows while the freed model buffers of alternating sizes
// fragment it (its dynamic mmap threshold moves them from mmap to the heap), then plateaus; how
// soon depends on the machine (an ISA's load-time copies): a CI machine grew 2.2 MB over 1,000
// cycles after a 60-cycle warm-up, with nothing leaked. Bytes in use from malloc are exact.
constexpr long kMallocLimit = 16 * 1024;
constexpr long kRssLimit = 4 * 1024 * 1024;

Growth growth_over_cycles(int n_threads, int &failures) {
    const CycleInputs in;
    for (const auto &b : in.bad) {  // each really is refused
        needle_model *m = nullptr;
        CHECK(needle_model_load_memory(b.data(), b.size(), nullptr, &m) == NEEDLE_E_FORMAT);
        CHECK(m == nullptr);
    }
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    needle_model *keep = nullptr;
    REQUIRE(needle_model_load_file(model_path("tiny").c_str(), &p, &keep) == NEEDLE_OK);
    Model kh(keep);
    failures = 0;
    for (int i = 0; i < 1000; ++i) failures += !cycle(in, p, keep, i);  // warm-up: allocator pools
    const size_t rss0 = rss_bytes(), malloc0 = malloc_in_use();
    for (int i = 0; i < 1000; ++i) failures += !cycle(in, p, keep, i);
    const Growth g{long(malloc_in_use()) - long(malloc0), long(rss_bytes()) - long(rss0)};
    MESSAGE("n_threads " << n_threads << " over 1,000 cycles: malloc in use " << g.malloc_bytes << " bytes, RSS "
                         << rss0 / 1024 << " KB -> " << (rss0 + g.rss) / 1024 << " KB"
                         << std::string(fixtures::kSanitized ? "; not checked under a sanitizer (LeakSanitizer checks leaks)" : ""));
    return g;
}

void check_flat(int n_threads) {
    int failures = 0;
    const Growth g = growth_over_cycles(n_threads, failures);
    CHECK(failures == 0);
    if (fixtures::kSanitized) return;
    CHECK(g.malloc_bytes < kMallocLimit);
    CHECK(g.rss < kRssLimit);
}

}  // namespace

TEST_CASE("misuse: 1,000 create/free cycles of models, failed loads, states and batches keep memory flat") {
    check_flat(1);  // n_threads 1: every state's task arena runs on its caller alone
}

// With worker threads: they join each state's task arena (a batched prefill of >= 2 positions, a
// large matmul). oneTBB keeps ~7 KB per destroyed arena that workers joined, which grew memory
// without bound until states leased their arenas from a pool (core/arena_pool.h).
TEST_CASE("misuse: 1,000 cycles with worker threads keep memory flat") {
    check_flat(2);
}
