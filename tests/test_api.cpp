// The C ABI contract of include/needle.h, through needle.h only: status codes and their order
// (arguments, then buffers, then room), specific per-thread messages, failing calls that leave
// the state untouched, out-pointers, handle lifetimes, loading errors, tokenizer buffers, model
// info against the fixture manifests, and batched prefill giving the same bits as unbatched.
#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

const std::string kText =
    "The quick brown fox jumps over the lazy dog. Permission is hereby granted, free of charge, "
    "to any person obtaining a copy of this software.";

// A scratch folder removed at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/needle_api_XXXXXX";
        const char *p = mkdtemp(tmpl);
        REQUIRE(p != nullptr);
        path = p;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string write(const std::string &name, const std::vector<uint8_t> &bytes) const {
        const std::string p = path + "/" + name;
        std::ofstream f(p, std::ios::binary);
        f.write(reinterpret_cast<const char *>(bytes.data()), std::streamsize(bytes.size()));
        REQUIRE(f.good());
        return p;
    }
};

needle_model *const kSentinelModel = reinterpret_cast<needle_model *>(uintptr_t(0x1234));
needle_state *const kSentinelState = reinterpret_cast<needle_state *>(uintptr_t(0x1234));
needle_batch *const kSentinelBatch = reinterpret_cast<needle_batch *>(uintptr_t(0x1234));

// Expects both loaders to refuse `bytes` with `want` (and NULL through the out-pointer).
void expect_load_fails(const TempDir &tmp, const std::string &name, const std::vector<uint8_t> &bytes,
                       needle_status want, const char *mention) {
    CAPTURE(name);
    const std::string path = tmp.write(name, bytes);
    needle_model *m = kSentinelModel;
    EXPECT_FAIL(want, needle_model_load_file(path.c_str(), nullptr, &m), mention);
    CHECK(m == nullptr);
    needle_model_free(m == kSentinelModel ? nullptr : m);
    m = kSentinelModel;
    EXPECT_FAIL(want, needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &m), mention);
    CHECK(m == nullptr);
    needle_model_free(m == kSentinelModel ? nullptr : m);
}

void put_u32(std::vector<uint8_t> &b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[off + i] = uint8_t(v >> (8 * i));
}
uint32_t get_u32(const std::vector<uint8_t> &b, size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(b[off + i]) << (8 * i);
    return v;
}

// Fresh-state reference: the logits after feeding `ids` then `probe`, one token at a time.
std::vector<float> reference_after(needle_model *m, const std::vector<uint32_t> &ids, uint32_t probe, size_t V) {
    State s = new_state(m);
    for (uint32_t t : ids) REQUIRE(needle_state_decode(s.get(), t, nullptr, 0) == NEEDLE_OK);
    return step(s.get(), probe, V);
}

}  // namespace

// ---------------------------------------------------------------- versions, statuses, errors

TEST_CASE("api: ABI check, version string and status strings") {
    CHECK(needle_abi_version() == NEEDLE_ABI_VERSION);
    CHECK(needle_check_abi(NEEDLE_ABI_VERSION) == NEEDLE_OK);
    EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_check_abi(NEEDLE_ABI_VERSION + 76),
                std::to_string(NEEDLE_ABI_VERSION + 76).c_str());
    // The message names both versions.
    CHECK(mentions(needle_last_error(), std::to_string(NEEDLE_ABI_VERSION)));
    EXPECT_FAIL(NEEDLE_E_UNSUPPORTED, needle_check_abi(0), "0");

    // "MAJOR.MINOR.PATCH"
    const char *v = needle_version_string();
    REQUIRE(v != nullptr);
    CHECK(v == needle_version_string());  // static text
    unsigned a = 0, b = 0, c = 0;
    int used = 0;
    CHECK(std::sscanf(v, "%u.%u.%u%n", &a, &b, &c, &used) == 3);
    CHECK(size_t(used) == std::strlen(v));

    std::vector<std::string> seen;
    for (needle_status s = NEEDLE_OK; s <= NEEDLE_E_INTERNAL; ++s) {
        CAPTURE(s);
        const char *t = needle_status_string(s);
        REQUIRE(t != nullptr);
        CHECK(std::strlen(t) > 0);
        CHECK(std::string(t) != "unknown status");
        CHECK(std::find(seen.begin(), seen.end(), t) == seen.end());  // distinct
        seen.push_back(t);
    }
    for (needle_status s : {-1, 10, 11, 100, INT32_MAX, INT32_MIN}) {
        CAPTURE(s);
        REQUIRE(needle_status_string(s) != nullptr);
        CHECK(std::string(needle_status_string(s)) == "unknown status");
    }
}

TEST_CASE("api: needle_last_error is per thread and unchanged by successful calls") {
    // A thread where nothing failed yet sees "".
    std::string fresh = "not run";
    std::thread([&] { fresh = needle_last_error(); }).join();
    CHECK(fresh == "");

    Model m = load(model_path("odd"));
    const size_t V = info_of(m.get()).vocab_size;
    State s = new_state(m.get());
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5000, nullptr, 0), "5000");
    const std::string msg = needle_last_error();

    // Successful calls of every kind leave it as it was.
    std::vector<float> lg(V);
    CHECK(needle_check_abi(NEEDLE_ABI_VERSION) == NEEDLE_OK);
    CHECK(needle_state_decode(s.get(), 2, lg.data(), V) == NEEDLE_OK);
    uint32_t ids[2] = {5, 6};
    CHECK(needle_state_prefill(s.get(), nullptr, ids, 2, nullptr, 0) == NEEDLE_OK);
    CHECK(needle_state_prefill(s.get(), nullptr, nullptr, 0, nullptr, 0) == NEEDLE_OK);
    size_t n = 0;
    uint32_t tok[16];
    CHECK(needle_model_tokenize(m.get(), "Hi", 2, 1, tok, 16, &n) == NEEDLE_OK);
    needle_model *m2 = nullptr;
    CHECK(needle_model_load_file(model_path("odd").c_str(), nullptr, &m2) == NEEDLE_OK);
    needle_model_free(m2);
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 2;
    CHECK(needle_generate(s.get(), nullptr, "x", 1, &gp, nullptr, nullptr, nullptr) == NEEDLE_OK);
    CHECK(needle_last_error() == msg);

    // A failure on another thread does not touch this thread's message.
    std::string other;
    std::thread([&] {
        CHECK(needle_state_decode(nullptr, 0, nullptr, 0) == NEEDLE_E_INVALID_ARGUMENT);
        other = needle_last_error();
    }).join();
    CHECK(!other.empty());
    CHECK(other != msg);
    CHECK(needle_last_error() == msg);
}

// ---------------------------------------------------------------- NULL handles and pointers

TEST_CASE("api: NULL handles and out-pointers on every entry point") {
    const std::string path = model_path("odd");
    Model m = load(path);
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    State s = new_state(m.get());
    std::vector<float> lg(V);
    uint32_t tok[4] = {2, 5, 6, 7};

    // Loading
    needle_model *mo = kSentinelModel;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(nullptr, nullptr, &mo), "path");
    CHECK(mo == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(path.c_str(), nullptr, nullptr), "out");
    mo = kSentinelModel;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_memory(nullptr, 100, nullptr, &mo), "data");
    CHECK(mo == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_memory(tok, sizeof tok, nullptr, nullptr), "out");
    needle_model_params mp;
    mp.struct_size = sizeof mp;
    needle_model_params_init(&mp);
    CHECK(mp.struct_size == sizeof mp);
    CHECK(mp.use_mmap == 1);
    CHECK(mp.n_threads == 0);
    mp.struct_size = 4;
    mo = kSentinelModel;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(path.c_str(), &mp, &mo), "struct_size");
    CHECK(mo == nullptr);
    mp.struct_size = sizeof mp;  // init keeps the caller's struct_size (4 would write nothing)
    needle_model_params_init(&mp);
    mp.n_threads = -3;
    mo = kSentinelModel;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_load_file(path.c_str(), &mp, &mo), "n_threads");
    CHECK(mo == nullptr);

    // Info
    needle_model_info ni;
    std::memset(&ni, 0, sizeof ni);
    ni.struct_size = sizeof ni;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_get_info(nullptr, &ni), "model");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_get_info(m.get(), nullptr), "info");

    // States and batches
    needle_state *so = kSentinelState;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create(nullptr, &so), "model");
    CHECK(so == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create(m.get(), nullptr), "out");
    so = kSentinelState;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create_ex(nullptr, nullptr, &so), "model");
    CHECK(so == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create_ex(m.get(), nullptr, nullptr), "out");
    needle_batch *bo = kSentinelBatch;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_batch_create(nullptr, 4, &bo), "model");
    CHECK(bo == nullptr);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_batch_create(m.get(), 4, nullptr), "out");

    // Forward
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(nullptr, 2, lg.data(), V), "state");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(nullptr, 2, nullptr, 0), "state");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(nullptr, nullptr, tok, 4, nullptr, 0), "state");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(nullptr, nullptr, nullptr, 0, nullptr, 0), "state");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), nullptr, nullptr, 4, nullptr, 0), "tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), nullptr, nullptr, 4, lg.data(), V), "tokens");
    CHECK(needle_state_pos(s.get()) == 0);

    // Tokenizer
    size_t n = 0;
    uint32_t ids[64];
    char text[64];
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(nullptr, "a", 1, 1, ids, 64, &n), "model");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), "a", 1, 1, ids, 64, nullptr), "n_tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), nullptr, 3, 1, ids, 64, &n), "text");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), "a", 1, 1, nullptr, 64, &n), "tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(nullptr, tok, 4, text, 64, &n), "model");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), tok, 4, text, 64, nullptr), "text_len");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), nullptr, 4, text, 64, &n), "tokens");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), tok, 4, nullptr, 64, &n), "text");
    // NULL text with length 0 is the empty text; NULL tokens with count 0 the empty sequence.
    CHECK(needle_model_tokenize(m.get(), nullptr, 0, 1, ids, 64, &n) == NEEDLE_OK);
    CHECK(n == 1);
    CHECK(ids[0] == info.bos_id);
    CHECK(needle_model_tokenize(m.get(), nullptr, 0, 0, ids, 64, &n) == NEEDLE_OK);
    CHECK(n == 0);
    std::memset(text, 'x', sizeof text);
    CHECK(needle_model_detokenize(m.get(), nullptr, 0, text, 64, &n) == NEEDLE_OK);
    CHECK(n == 0);
    CHECK(text[0] == '\0');

    // Generation
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(nullptr, nullptr, "a", 1, nullptr, nullptr, nullptr, nullptr),
                "state");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_generate(s.get(), nullptr, nullptr, 5, nullptr, nullptr, nullptr, nullptr),
                "prompt");
    CHECK(needle_state_pos(s.get()) == 0);

    // NULL is ignored / harmless.
    CHECK(needle_state_pos(nullptr) == 0);
    needle_model_free(nullptr);
    needle_state_free(nullptr);
    needle_batch_free(nullptr);
    needle_state_reset(nullptr);
    needle_model_params_init(nullptr);
    needle_state_params_init(nullptr);
    needle_generate_params_init(nullptr);
}

// ---------------------------------------------------------------- model info

TEST_CASE("api: model_info equals the fixture manifest header") {
    for (const std::string name : {"tiny", "odd", "needle2"}) {
        CAPTURE(name);
        const auto man = fixtures::read_json(fixtures::v2("refs/" + name + "/manifest.json"));
        const auto &h = man["header"];
        Model m = load(model_path(name));
        const needle_model_info info = info_of(m.get());
        CHECK(info.struct_size == sizeof info);
        CHECK(info.format_version == 2);
        CHECK(info.vocab_size == h["vocab_size"].get<uint32_t>());
        CHECK(info.d_model == h["d_model"].get<uint32_t>());
        CHECK(info.num_layers == h["num_layers"].get<uint32_t>());
        CHECK(info.num_heads == h["num_heads"].get<uint32_t>());
        CHECK(info.num_kv_heads == h["num_kv_heads"].get<uint32_t>());
        CHECK(info.head_dim == h["head_dim"].get<uint32_t>());
        CHECK(info.v_head_dim == h["head_dim"].get<uint32_t>());
        CHECK(info.max_seq_len == h["max_seq_len"].get<uint32_t>());
        // Effective window: the header's for these fixtures (odd's 0 sizes to max_seq_len =
        // full causal, reported as 0; model-v2.md §4.2).
        CHECK(info.kv_window == h["kv_window"].get<uint32_t>());
        CHECK(info.mhc_lanes == h["mhc_lanes"].get<uint32_t>());
        CHECK(info.num_engram_sites == h["engram_layers"].size());
        CHECK(info.has_tokenizer == 1);
        CHECK(info.file_bytes == man["cact_bytes"].get<uint64_t>());
        uint64_t weights = 0, tok_offset = 0;
        for (const auto &t : man["tensors"]) {
            if (t["name"] == "tokenizer") tok_offset = t["offset"].get<uint64_t>();
            else weights += t["nbytes"].get<uint64_t>();
        }
        CHECK(info.weight_bytes == weights);
        // Ids from the tokenizer blob: u32 n_pieces, pad, eos, bos, unk.
        const std::vector<uint8_t> file = fixtures::read_bytes(model_path(name));
        REQUIRE(tok_offset + 20 <= file.size());
        CHECK(info.pad_id == get_u32(file, tok_offset + 4));
        CHECK(info.eos_id == get_u32(file, tok_offset + 8));
        CHECK(info.bos_id == get_u32(file, tok_offset + 12));
        CHECK(info.unk_id == get_u32(file, tok_offset + 16));
        CHECK(info.bos_id == man["decode"]["bos_id"].get<uint32_t>());
        CHECK(info.eos_id == 1);

        // A struct_size below the first version is refused and nothing is written.
        for (uint32_t small : {0u, 4u, uint32_t(offsetof(needle_model_info, file_bytes))}) {
            CAPTURE(small);
            needle_model_info ni;
            std::memset(&ni, 0xAB, sizeof ni);
            ni.struct_size = small;
            needle_model_info before = ni;
            EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_get_info(m.get(), &ni), "struct_size");
            CHECK(std::memcmp(&ni, &before, sizeof ni) == 0);
        }
    }
}

// ---------------------------------------------------------------- decode / prefill arguments

TEST_CASE("api: decode checks arguments, then the buffer, then room, failures change nothing") {
    for (const std::string name : {"tiny", "odd"}) {
        CAPTURE(name);
        Model m = load(model_path(name));
        const size_t V = info_of(m.get()).vocab_size;
        REQUIRE(V == 1024);
        const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
        State s = new_state(m.get());
        REQUIRE(needle_state_prefill(s.get(), nullptr, ids.data(), 9, nullptr, 0) == NEEDLE_OK);
        REQUIRE(needle_state_pos(s.get()) == 9);
        std::vector<float> lg(V + 1, 7.0f);
        const std::vector<float> lg_before = lg;

        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), uint32_t(V), lg.data(), V), "1024");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5000, lg.data(), V), "5000");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 0xFFFFFFFFu, nullptr, 0), "4294967295");
        EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_decode(s.get(), 5, lg.data(), V - 1), "1023");
        EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_decode(s.get(), 5, lg.data(), 1), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5, nullptr, V), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5, nullptr, 1), "logits");
        // Order: a bad token beats a small buffer.
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5000, lg.data(), 10), "5000");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), 5000, nullptr, 10), "5000|logits");
        CHECK(same_bits(lg, lg_before));  // nothing written to the caller's buffer

        // Unchanged: position, and the next logits are those of a state that saw no failure.
        CHECK(needle_state_pos(s.get()) == 9);
        const std::vector<uint32_t> fed(ids.begin(), ids.begin() + 9);
        CHECK(same_bits(step(s.get(), ids[9], V), reference_after(m.get(), fed, ids[9], V)));
        // A buffer larger than V is fine; only V floats are written.
        lg.assign(V + 1, 7.0f);
        REQUIRE(needle_state_decode(s.get(), ids[10], lg.data(), V + 1) == NEEDLE_OK);
        CHECK(lg[V] == 7.0f);
        CHECK(needle_state_pos(s.get()) == 11);
    }
}

TEST_CASE("api: prefill checks arguments, then the buffer, then room, failures change nothing") {
    Model m = load(model_path("tiny"));
    Model other = load(model_path("odd"));
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
    REQUIRE(ids.size() > 20);
    State s = new_state(m.get());
    Batch b = new_batch(m.get(), 4);
    Batch ob = new_batch(other.get(), 4);
    REQUIRE(needle_state_prefill(s.get(), b.get(), ids.data(), 6, nullptr, 0) == NEEDLE_OK);
    REQUIRE(needle_state_pos(s.get()) == 6);
    std::vector<float> lg(V, 3.0f);
    const std::vector<float> lg_before = lg;

    // A bad token at the end of the list: nothing before it may be fed.
    std::vector<uint32_t> bad(ids.begin() + 6, ids.begin() + 16);
    bad.back() = 4096;
    for (needle_batch *bb : {static_cast<needle_batch *>(nullptr), b.get()}) {
        CAPTURE(bb != nullptr);
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, bad.data(), bad.size(), lg.data(), V),
                    "4096");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, bad.data(), bad.size(), nullptr, 0),
                    "4096");
        // Order: bad token before a small buffer, bad token before room.
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, bad.data(), bad.size(), lg.data(), 5),
                    "4096");
        EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_prefill(s.get(), bb, ids.data(), 3, lg.data(), V - 1),
                    "1023");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, ids.data(), 3, nullptr, V), "logits");
        // n_tokens 0 with a logits buffer (or a length) is an argument error.
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, ids.data(), 0, lg.data(), V), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, nullptr, 0, lg.data(), V), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, nullptr, 0, nullptr, V), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), bb, ids.data(), 0, lg.data(), 1), "logits");
        // Prefill of 0 tokens without logits is a no-op.
        CHECK(needle_state_prefill(s.get(), bb, ids.data(), 0, nullptr, 0) == NEEDLE_OK);
        CHECK(needle_state_prefill(s.get(), bb, nullptr, 0, nullptr, 0) == NEEDLE_OK);
    }
    // A batch of another model, also before the buffer check.
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), ob.get(), ids.data(), 3, lg.data(), V), "batch");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), ob.get(), ids.data(), 3, lg.data(), 2), "batch");
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_prefill(s.get(), ob.get(), ids.data(), 3, nullptr, 0), "batch");
    // Too many tokens for the room left.
    const std::vector<uint32_t> many(info.max_seq_len - 5, 100);
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), b.get(), many.data(), many.size(), lg.data(), V),
                std::to_string(info.max_seq_len).c_str());
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, many.data(), many.size(), nullptr, 0),
                std::to_string(info.max_seq_len).c_str());
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_prefill(s.get(), b.get(), many.data(), many.size(), lg.data(), 9),
                "logits");
    // The ids of a call that does not fit are never read (needle.h, Errors: n_tokens may be a
    // wrong length), so a bad one there is not what is reported.
    std::vector<uint32_t> many_bad = many;
    many_bad[0] = uint32_t(V);
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL,
                needle_state_prefill(s.get(), b.get(), many_bad.data(), many_bad.size(), lg.data(), 9), "logits");
    EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL,
                needle_state_prefill(s.get(), b.get(), many_bad.data(), many_bad.size(), lg.data(), V),
                std::to_string(info.max_seq_len).c_str());
    // A bad id in a call that fits is an argument error, before the buffer.
    many_bad.resize(5);
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT,
                needle_state_prefill(s.get(), b.get(), many_bad.data(), many_bad.size(), lg.data(), 9), "1024");
    CHECK(same_bits(lg, lg_before));

    // Unchanged: position and next logits.
    CHECK(needle_state_pos(s.get()) == 6);
    const std::vector<uint32_t> fed(ids.begin(), ids.begin() + 6);
    CHECK(same_bits(step(s.get(), ids[6], V), reference_after(m.get(), fed, ids[6], V)));
}

TEST_CASE("api: batch and state creation arguments") {
    Model m = load(model_path("odd"));
    const needle_model_info info = info_of(m.get());
    needle_batch *b = kSentinelBatch;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_batch_create(m.get(), 0, &b), "capacity");
    CHECK(b == nullptr);
    b = kSentinelBatch;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_batch_create(m.get(), info.max_seq_len + 1, &b),
                std::to_string(info.max_seq_len + 1).c_str());
    CHECK(b == nullptr);
    b = kSentinelBatch;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_batch_create(m.get(), 0xFFFFFFFFu, &b), "capacity");
    CHECK(b == nullptr);
    Batch full = new_batch(m.get(), info.max_seq_len);  // the largest allowed
    Batch one = new_batch(m.get(), 1);

    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    CHECK(sp.struct_size == sizeof sp);
    CHECK(sp.kv_window == -1);
    needle_state *s = kSentinelState;
    for (int32_t w : {-2, -100, INT32_MIN}) {
        CAPTURE(w);
        sp.kv_window = w;
        s = kSentinelState;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create_ex(m.get(), &sp, &s), "kv_window");
        CHECK(s == nullptr);
    }
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.struct_size = 2;
    s = kSentinelState;
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_create_ex(m.get(), &sp, &s), "struct_size");
    CHECK(s == nullptr);

    // -1 (default), NULL params and needle_state_create are the same state; 0 is full causal,
    // which for odd (header window 0 -> full causal) is the same too.
    const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
    const size_t V = info.vocab_size;
    std::vector<std::vector<float>> runs;
    for (int variant = 0; variant < 4; ++variant) {
        needle_state *st = nullptr;
        sp.struct_size = sizeof sp;
        needle_state_params_init(&sp);
        if (variant == 0) REQUIRE(needle_state_create(m.get(), &st) == NEEDLE_OK);
        if (variant == 1) REQUIRE(needle_state_create_ex(m.get(), nullptr, &st) == NEEDLE_OK);
        if (variant == 2) REQUIRE(needle_state_create_ex(m.get(), &sp, &st) == NEEDLE_OK);
        if (variant == 3) {
            sp.kv_window = 0;
            REQUIRE(needle_state_create_ex(m.get(), &sp, &st) == NEEDLE_OK);
        }
        State h(st);
        CHECK(needle_state_pos(st) == 0);
        runs.push_back(prefill(st, nullptr, ids, V));
    }
    for (size_t i = 1; i < runs.size(); ++i) CHECK(same_bits(runs[0], runs[i]));
}

TEST_CASE("api: CONTEXT_FULL at max_seq_len, the state stays valid and resets") {
    for (const std::string name : {"tiny", "odd"}) {
        CAPTURE(name);
        Model m = load(model_path(name));
        const needle_model_info info = info_of(m.get());
        const size_t V = info.vocab_size;
        const uint32_t T = info.max_seq_len;
        std::vector<uint32_t> fill(T);
        std::mt19937 rng(7);
        for (uint32_t &t : fill) t = 14 + rng() % (uint32_t(V) - 14);
        fill[0] = info.bos_id;

        State s = new_state(m.get());
        // Up to one short of full, then exactly full.
        REQUIRE(needle_state_prefill(s.get(), nullptr, fill.data(), T - 1, nullptr, 0) == NEEDLE_OK);
        CHECK(needle_state_pos(s.get()) == T - 1);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, fill.data(), 2, nullptr, 0),
                    std::to_string(T).c_str());
        CHECK(needle_state_pos(s.get()) == T - 1);
        std::vector<float> last(V);
        REQUIRE(needle_state_decode(s.get(), fill[T - 1], last.data(), V) == NEEDLE_OK);
        CHECK(needle_state_pos(s.get()) == T);

        // Full: every feed is CONTEXT_FULL, after the argument and buffer checks.
        std::vector<float> lg(V);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), 5, lg.data(), V), std::to_string(T).c_str());
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s.get(), 5, nullptr, 0), std::to_string(T).c_str());
        EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_state_decode(s.get(), 5, lg.data(), V - 1), "logits");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_state_decode(s.get(), uint32_t(V) + 1, lg.data(), 3), "1025");
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_prefill(s.get(), nullptr, fill.data(), 1, nullptr, 0),
                    std::to_string(T).c_str());
        CHECK(needle_state_prefill(s.get(), nullptr, nullptr, 0, nullptr, 0) == NEEDLE_OK);
        needle_generate_params gp;
        gp.struct_size = sizeof gp;
        needle_generate_params_init(&gp);
        EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_generate(s.get(), nullptr, "Hi", 2, &gp, nullptr, nullptr, nullptr),
                    std::to_string(T).c_str());
        CHECK(needle_state_pos(s.get()) == T);

        // The whole sequence through a batch gives the same last logits.
        {
            State s2 = new_state(m.get());
            Batch b = new_batch(m.get(), 64);
            CHECK(same_bits(prefill(s2.get(), b.get(), fill, V), last));
            CHECK(needle_state_pos(s2.get()) == T);
            EXPECT_FAIL(NEEDLE_E_CONTEXT_FULL, needle_state_decode(s2.get(), 5, nullptr, 0), std::to_string(T).c_str());
        }

        // Reset: back to position 0 and exactly a fresh state.
        needle_state_reset(s.get());
        CHECK(needle_state_pos(s.get()) == 0);
        State fresh = new_state(m.get());
        for (size_t i = 0; i < 12; ++i) CHECK(same_bits(step(s.get(), fill[i], V), step(fresh.get(), fill[i], V)));
        CHECK(needle_state_pos(s.get()) == 12);
    }
}

TEST_CASE("api: NULL logits skip only the LM head") {
    for (const std::string name : {"tiny", "odd"}) {
        CAPTURE(name);
        Model m = load(model_path(name));
        const size_t V = info_of(m.get()).vocab_size;
        const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
        REQUIRE(ids.size() >= 30);
        State every = new_state(m.get()), skip = new_state(m.get());
        std::vector<float> a, b;
        for (size_t i = 0; i < ids.size(); ++i) {
            a = step(every.get(), ids[i], V);
            if (i % 3 == 2 || i + 1 == ids.size()) {
                b = step(skip.get(), ids[i], V);
                CHECK(same_bits(a, b));
            } else {
                REQUIRE(needle_state_decode(skip.get(), ids[i], nullptr, 0) == NEEDLE_OK);
            }
        }
        CHECK(needle_state_pos(skip.get()) == ids.size());
        // Prefill without logits, then decode.
        State pre = new_state(m.get());
        REQUIRE(needle_state_prefill(pre.get(), nullptr, ids.data(), ids.size() - 1, nullptr, 0) == NEEDLE_OK);
        CHECK(same_bits(step(pre.get(), ids.back(), V), a));
        Batch bt = new_batch(m.get(), 5);
        State preb = new_state(m.get());
        REQUIRE(needle_state_prefill(preb.get(), bt.get(), ids.data(), ids.size() - 1, nullptr, 0) == NEEDLE_OK);
        CHECK(same_bits(step(preb.get(), ids.back(), V), a));
    }
}

// ---------------------------------------------------------------- batched prefill

namespace {
void check_batched_prefill(const std::string &name, const std::vector<uint32_t> &capacities, size_t prompt_len,
                           int decode_steps) {
    CAPTURE(name);
    Model m = load(model_path(name));
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    std::string text;
    while (true) {
        text += kText + " ";
        if (tokenize(m.get(), text, true).size() >= prompt_len) break;
    }
    std::vector<uint32_t> ids = tokenize(m.get(), text, true);
    ids.resize(prompt_len);

    // Unbatched reference: prefill, then greedy steps.
    State ref = new_state(m.get());
    std::vector<std::vector<float>> want{prefill(ref.get(), nullptr, ids, V)};
    std::vector<uint32_t> fed;
    for (int i = 0; i < decode_steps; ++i) {
        fed.push_back(argmax(want.back()));
        want.push_back(step(ref.get(), fed.back(), V));
    }

    for (uint32_t cap : capacities) {
        CAPTURE(cap);
        Batch b = new_batch(m.get(), cap);
        State s = new_state(m.get());
        CHECK(same_bits(prefill(s.get(), b.get(), ids, V), want[0]));
        CHECK(needle_state_pos(s.get()) == ids.size());
        for (int i = 0; i < decode_steps; ++i) {
            CAPTURE(i);
            CHECK(same_bits(step(s.get(), fed[size_t(i)], V), want[size_t(i) + 1]));
        }
        // Starting mid-sequence (pos > 0), with the same batch serving another state.
        State s2 = new_state(m.get());
        const size_t head = 13 % ids.size();
        REQUIRE(needle_state_prefill(s2.get(), nullptr, ids.data(), head, nullptr, 0) == NEEDLE_OK);
        const std::vector<uint32_t> tail(ids.begin() + long(head), ids.end());
        CHECK(same_bits(prefill(s2.get(), b.get(), tail, V), want[0]));
        if (decode_steps > 0) CHECK(same_bits(step(s2.get(), fed[0], V), want[1]));
    }
}
}  // namespace

TEST_CASE("api: batched prefill is bit-identical to unbatched (tiny, odd)") {
    // 100 tokens: tiny's window (48) wraps its KV ring inside the prompt.
    check_batched_prefill("tiny", {1, 7, 64, 128, 512}, 100, 8);
    check_batched_prefill("odd", {1, 7, 64, 128, 256}, 100, 8);
}

TEST_CASE("api: batched prefill is bit-identical to unbatched (needle2, short)") {
    check_batched_prefill("needle2", {7, 64}, 20, 2);
}

// ---------------------------------------------------------------- loading

TEST_CASE("api: load from memory, from a copied file and with or without mmap give the same model") {
    const std::string path = model_path("tiny");
    Model m = load(path);
    const needle_model_info info = info_of(m.get());
    const size_t V = info.vocab_size;
    const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
    State s = new_state(m.get());
    const std::vector<float> want = prefill(s.get(), nullptr, ids, V);

    auto check_same = [&](needle_model *other, uint32_t n_threads = 0) {
        needle_model_info oi = info_of(other);
        if (n_threads) {  // the one field that follows the load options
            CHECK(oi.n_threads == n_threads);
            oi.n_threads = info.n_threads;
        }
        CHECK(std::memcmp(&oi, &info, sizeof oi) == 0);
        CHECK(tokenize(other, kText, true) == ids);
        State os = new_state(other);
        CHECK(same_bits(prefill(os.get(), nullptr, ids, V), want));
    };
    for (int mmap : {0, 1}) {
        CAPTURE(mmap);
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.use_mmap = mmap;
        Model o = load(path, &p);
        check_same(o.get());
    }
    {
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.n_threads = 1;
        Model o = load(path, &p);
        check_same(o.get(), 1);
    }
    {
        // The bytes are copied: the caller's buffer is overwritten and freed before use.
        std::vector<uint8_t> bytes = fixtures::read_bytes(path);
        needle_model *o = nullptr;
        REQUIRE(needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &o) == NEEDLE_OK);
        Model h(o);
        std::fill(bytes.begin(), bytes.end(), uint8_t(0xEE));
        bytes.clear();
        bytes.shrink_to_fit();
        check_same(o);
    }
}

TEST_CASE("api: loading errors: IO, FORMAT and UNSUPPORTED with specific messages") {
    TempDir tmp;
    needle_model *m = kSentinelModel;
    const std::string missing = tmp.path + "/no_such_model.cact";
    EXPECT_FAIL(NEEDLE_E_IO, needle_model_load_file(missing.c_str(), nullptr, &m), "no_such_model.cact");
    CHECK(m == nullptr);
    for (int mmap : {0, 1}) {
        needle_model_params p;
        p.struct_size = sizeof p;
        needle_model_params_init(&p);
        p.use_mmap = mmap;
        m = kSentinelModel;
        EXPECT_FAIL(NEEDLE_E_IO, needle_model_load_file(tmp.path.c_str(), &p, &m), tmp.path.c_str());  // a directory
        CHECK(m == nullptr);
        m = kSentinelModel;
        EXPECT_FAIL(NEEDLE_E_IO, needle_model_load_file(missing.c_str(), &p, &m), "no_such_model.cact");
        CHECK(m == nullptr);
        // A FIFO with no writer: refused at once (a blocking open would hang here).
        const std::string fifo = tmp.path + "/pipe.cact";
        REQUIRE((::mkfifo(fifo.c_str(), 0600) == 0 || errno == EEXIST));
        m = kSentinelModel;
        EXPECT_FAIL(NEEDLE_E_IO, needle_model_load_file(fifo.c_str(), &p, &m), "not a regular file");
        CHECK(m == nullptr);
    }

    expect_load_fails(tmp, "empty.cact", {}, NEEDLE_E_FORMAT, "truncated|empty|0 bytes");
    std::mt19937 rng(12345);
    std::vector<uint8_t> noise(4096);
    for (uint8_t &x : noise) x = uint8_t(rng());
    REQUIRE((get_u32(noise, 0) >> 4) != 0x05E12A8u);
    expect_load_fails(tmp, "noise.cact", noise, NEEDLE_E_FORMAT, "cact|tag|magic");
    std::string html =
        "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found</h1>"
        "<p>The requested URL was not found on this server.</p></body></html>\n";
    while (html.size() < 2000) html += "<!-- padding -->\n";
    expect_load_fails(tmp, "page.html", std::vector<uint8_t>(html.begin(), html.end()), NEEDLE_E_FORMAT,
                      "cact|tag|magic");
    const std::string short_html = "<html>nope</html>";
    expect_load_fails(tmp, "short.html", std::vector<uint8_t>(short_html.begin(), short_html.end()), NEEDLE_E_FORMAT,
                      "truncated|bytes");

    const std::vector<uint8_t> good = fixtures::read_bytes(model_path("odd"));
    std::vector<uint8_t> half(good.begin(), good.begin() + long(good.size() / 2));
    expect_load_fails(tmp, "half.cact", half, NEEDLE_E_FORMAT, "truncated|bytes|offset");

    // A known tag this build cannot run, in an otherwise valid header.
    std::vector<uint8_t> old = good;
    put_u32(old, 0, 0x05E12A82u);
    expect_load_fails(tmp, "old.cact", old, NEEDLE_E_UNSUPPORTED, "0x05E12A82");
    // The Needle 3 tag selects the v3 parser, which refuses a v2 body (its header is shorter).
    std::vector<uint8_t> v3 = good;
    put_u32(v3, 0, 0x05E12A84u);
    expect_load_fails(tmp, "v3.cact", v3, NEEDLE_E_FORMAT, "header|tensor|truncated");

    // The unmodified bytes load both ways.
    const std::string ok = tmp.write("ok.cact", good);
    Model a = load(ok);
    needle_model *b = nullptr;
    REQUIRE(needle_model_load_memory(good.data(), good.size(), nullptr, &b) == NEEDLE_OK);
    needle_model_free(b);
}

// ---------------------------------------------------------------- handle lifetimes

TEST_CASE("api: handles may be freed in any order") {
    const std::string path = model_path("tiny");
    Model refm = load(path);
    const size_t V = info_of(refm.get()).vocab_size;
    const std::vector<uint32_t> ids = tokenize(refm.get(), kText, true);
    const size_t half = ids.size() / 2;
    const std::vector<uint32_t> first(ids.begin(), ids.begin() + long(half)), second(ids.begin() + long(half), ids.end());
    std::vector<std::vector<float>> want;
    {
        State r = new_state(refm.get());
        want.push_back(prefill(r.get(), nullptr, first, V));
        want.push_back(prefill(r.get(), nullptr, second, V));
        for (int i = 0; i < 4; ++i) want.push_back(step(r.get(), argmax(want.back()), V));
    }

    // Model first, then keep using the state and the batch, then free batch, then state.
    {
        needle_model *m = nullptr;
        REQUIRE(needle_model_load_file(path.c_str(), nullptr, &m) == NEEDLE_OK);
        needle_state *s = nullptr;
        needle_batch *b = nullptr;
        REQUIRE(needle_state_create(m, &s) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 8, &b) == NEEDLE_OK);
        needle_model_free(m);
        CHECK(same_bits(prefill(s, b, first, V), want[0]));
        CHECK(same_bits(prefill(s, nullptr, second, V), want[1]));
        for (int i = 0; i < 4; ++i) CHECK(same_bits(step(s, argmax(want[size_t(i) + 1]), V), want[size_t(i) + 2]));
        needle_generate_params gp;
        gp.struct_size = sizeof gp;
        needle_generate_params_init(&gp);
        gp.max_tokens = 3;
        needle_state_reset(s);
        CHECK(needle_generate(s, b, "Hello", 5, &gp, nullptr, nullptr, nullptr) == NEEDLE_OK);
        needle_batch_free(b);
        needle_state_free(s);
    }
    // Model, then one state, then the batch still serves the other state.
    {
        needle_model *m = nullptr;
        REQUIRE(needle_model_load_file(path.c_str(), nullptr, &m) == NEEDLE_OK);
        needle_state *s1 = nullptr, *s2 = nullptr;
        needle_batch *b = nullptr;
        REQUIRE(needle_state_create(m, &s1) == NEEDLE_OK);
        REQUIRE(needle_state_create(m, &s2) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 3, &b) == NEEDLE_OK);
        needle_model_free(m);
        needle_state_free(s1);
        CHECK(same_bits(prefill(s2, b, first, V), want[0]));
        needle_state_free(s2);
        needle_batch_free(b);
    }
    // State and batch before the model.
    {
        needle_model *m = nullptr;
        REQUIRE(needle_model_load_file(path.c_str(), nullptr, &m) == NEEDLE_OK);
        needle_state *s = nullptr;
        needle_batch *b = nullptr;
        REQUIRE(needle_state_create(m, &s) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 3, &b) == NEEDLE_OK);
        CHECK(same_bits(prefill(s, b, first, V), want[0]));
        needle_state_free(s);
        needle_batch_free(b);
        CHECK(tokenize(m, kText, true) == ids);
        needle_model_free(m);
    }
    // Batch, model, state.
    {
        needle_model *m = nullptr;
        REQUIRE(needle_model_load_file(path.c_str(), nullptr, &m) == NEEDLE_OK);
        needle_state *s = nullptr;
        needle_batch *b = nullptr;
        REQUIRE(needle_state_create(m, &s) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 3, &b) == NEEDLE_OK);
        needle_batch_free(b);
        needle_model_free(m);
        CHECK(same_bits(prefill(s, nullptr, first, V), want[0]));
        needle_state_free(s);
    }
}

// ---------------------------------------------------------------- tokenizer buffers

TEST_CASE("api: tokenize and detokenize report the needed size") {
    Model m = load(model_path("odd"));
    const needle_model_info info = info_of(m.get());
    const auto man = fixtures::read_json(fixtures::v2("refs/odd/manifest.json"));

    // Every manifest prompt: ids (BOS first) and the size protocol.
    for (const auto &pr : man["prompts"]) {
        const std::string text = pr["text"];
        const std::vector<uint32_t> want = pr["ids"];
        CAPTURE(pr["name"].get<std::string>());
        size_t n = 12345;
        CHECK(needle_model_tokenize(m.get(), text.data(), text.size(), 1, nullptr, 0, &n) ==
              (want.empty() ? NEEDLE_OK : NEEDLE_E_BUFFER_TOO_SMALL));
        CHECK(n == want.size());
        std::vector<uint32_t> ids(want.size() + 2, 0xDEADu);
        if (want.size() > 1) {
            n = 0;
            EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL,
                        needle_model_tokenize(m.get(), text.data(), text.size(), 1, ids.data(), want.size() - 1, &n),
                        std::to_string(want.size()).c_str());
            CHECK(n == want.size());
            CHECK(std::all_of(ids.begin(), ids.end(), [](uint32_t x) { return x == 0xDEADu; }));  // nothing written
        }
        n = 0;
        REQUIRE(needle_model_tokenize(m.get(), text.data(), text.size(), 1, ids.data(), want.size(), &n) == NEEDLE_OK);
        CHECK(n == want.size());
        CHECK(std::vector<uint32_t>(ids.begin(), ids.begin() + long(n)) == want);
        CHECK(ids[n] == 0xDEADu);
        // Without BOS: the same minus the first id.
        CHECK(tokenize(m.get(), text, false) == std::vector<uint32_t>(want.begin() + 1, want.end()));

        // Detokenize: BOS gives nothing, the text round-trips (no U+2581 in these prompts).
        size_t len = 777;
        CHECK(needle_model_detokenize(m.get(), want.data(), want.size(), nullptr, 0, &len) == NEEDLE_E_BUFFER_TOO_SMALL);
        CHECK(len == text.size());
        std::vector<char> buf(text.size() + 8, 'q');
        len = 0;
        // Room for the text but not the NUL.
        EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL,
                    needle_model_detokenize(m.get(), want.data(), want.size(), buf.data(), text.size(), &len),
                    std::to_string(text.size()).c_str());
        CHECK(len == text.size());
        CHECK(std::all_of(buf.begin(), buf.end(), [](char c) { return c == 'q'; }));
        len = 0;
        REQUIRE(needle_model_detokenize(m.get(), want.data(), want.size(), buf.data(), text.size() + 1, &len) == NEEDLE_OK);
        CHECK(len == text.size());
        CHECK(std::string(buf.data(), len) == text);
        CHECK(buf[len] == '\0');
        CHECK(buf[len + 1] == 'q');
    }

    // Empty: capacity 0 cannot hold the NUL.
    size_t len = 5;
    char c = 'z';
    EXPECT_FAIL(NEEDLE_E_BUFFER_TOO_SMALL, needle_model_detokenize(m.get(), nullptr, 0, &c, 0, &len), "capacity|0");
    CHECK(len == 0);
    CHECK(c == 'z');
    CHECK(needle_model_detokenize(m.get(), nullptr, 0, &c, 1, &len) == NEEDLE_OK);
    CHECK(c == '\0');

    // Ids out of range.
    const uint32_t bad[3] = {20, info.vocab_size, 30};
    char buf[64];
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), bad, 3, buf, sizeof buf, &len), "1024");
    const uint32_t huge[1] = {0xFFFFFFFFu};
    EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_detokenize(m.get(), huge, 1, buf, sizeof buf, &len), "4294967295");
}

TEST_CASE("api: tokenize takes UTF-8 only") {
    Model m = load(model_path("odd"));
    uint32_t ids[64];
    for (const std::string &bad :
         {std::string("\xFF"), std::string("ab\xC3"), std::string("\xC3("), std::string("\xC0\xAF"),
          std::string("\xE0\x80\xAF"), std::string("\xED\xA0\x80"), std::string("x\xF4\x90\x80\x80"),
          std::string("\x80"), std::string("ok \xF0\x9F\x99")}) {
        CAPTURE(bad);
        size_t n = 999;
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), bad.data(), bad.size(), 1, ids, 64, &n),
                    "UTF-8|utf8");
        EXPECT_FAIL(NEEDLE_E_INVALID_ARGUMENT, needle_model_tokenize(m.get(), bad.data(), bad.size(), 1, nullptr, 0, &n),
                    "UTF-8|utf8");
    }
    // Valid edge cases: U+0000 (embedded), U+FFFF, U+10FFFF, 4-byte emoji, text_len stops early.
    for (const std::string &good : {std::string("a\0b", 3), std::string("\xEF\xBF\xBF"), std::string("\xF4\x8F\xBF\xBF"),
                                    std::string("\xF0\x9F\x99\x82 ok")}) {
        CAPTURE(good);
        size_t n = 0;
        CHECK(needle_model_tokenize(m.get(), good.data(), good.size(), 0, ids, 64, &n) == NEEDLE_OK);
        CHECK(n > 0);
        CHECK(detokenize(m.get(), std::vector<uint32_t>(ids, ids + n)) == good);
    }
    size_t n = 0;
    const char *two = "hi\xFF";  // only the first two bytes are the text
    CHECK(needle_model_tokenize(m.get(), two, 2, 0, ids, 64, &n) == NEEDLE_OK);
    CHECK(detokenize(m.get(), std::vector<uint32_t>(ids, ids + n)) == "hi");
}

// ---------------------------------------------------------------- windows and threads

TEST_CASE("api: state_create_ex kv_window: -1 is the model's, 0 full causal, >= max_seq_len full causal") {
    Model m = load(model_path("tiny"));  // header window 48
    const needle_model_info info = info_of(m.get());
    REQUIRE(info.kv_window == 48);
    const size_t V = info.vocab_size;
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 80; ++i) ids.push_back(i == 0 ? info.bos_id : 20 + (i * 53) % 900);

    auto run = [&](int32_t w, std::vector<std::vector<float>> &rows) {
        needle_state_params p;
        p.struct_size = sizeof p;
        needle_state_params_init(&p);
        p.kv_window = w;
        needle_state *s = nullptr;
        REQUIRE(needle_state_create_ex(m.get(), &p, &s) == NEEDLE_OK);
        State h(s);
        for (uint32_t t : ids) rows.push_back(step(s, t, V));
    };
    std::vector<std::vector<float>> def, w48, full, big;
    run(-1, def);
    run(48, w48);
    run(0, full);
    run(int32_t(info.max_seq_len) + 100, big);
    size_t diff_before = 0, diff_after = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        CHECK(same_bits(def[i], w48[i]));
        CHECK(same_bits(full[i], big[i]));
        if (!same_bits(def[i], full[i])) ++(i < 48 ? diff_before : diff_after);
    }
    CHECK(diff_before == 0);              // the window only matters past 48 tokens
    CHECK(diff_after == ids.size() - 48);  // and then at every position
}

TEST_CASE("api: one model serves many threads at once") {
    Model m = load(model_path("odd"));
    const size_t V = info_of(m.get()).vocab_size;
    const std::vector<uint32_t> ids = tokenize(m.get(), kText, true);
    std::vector<std::vector<float>> want;
    {
        State s = new_state(m.get());
        for (uint32_t t : ids) want.push_back(step(s.get(), t, V));
    }
    constexpr int kThreads = 4;
    std::vector<int> bad(kThreads, 0), tok_bad(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            needle_state *s = nullptr;
            if (needle_state_create(m.get(), &s) != NEEDLE_OK) {
                bad[size_t(t)] = -1;
                return;
            }
            std::vector<float> lg(V);
            for (int rep = 0; rep < 3; ++rep) {
                needle_state_reset(s);
                for (size_t i = 0; i < ids.size(); ++i) {
                    if (needle_state_decode(s, ids[i], lg.data(), V) != NEEDLE_OK ||
                        std::memcmp(lg.data(), want[i].data(), V * sizeof(float)) != 0)
                        ++bad[size_t(t)];
                }
                uint32_t out[256];
                size_t n = 0;
                if (needle_model_tokenize(m.get(), kText.data(), kText.size(), 1, out, 256, &n) != NEEDLE_OK ||
                    std::vector<uint32_t>(out, out + n) != ids)
                    ++tok_bad[size_t(t)];
            }
            needle_state_free(s);
        });
    }
    for (std::thread &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
        CAPTURE(t);
        CHECK(bad[size_t(t)] == 0);
        CHECK(tok_bad[size_t(t)] == 0);
    }
}
