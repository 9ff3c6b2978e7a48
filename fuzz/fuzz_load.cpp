// libFuzzer target: arbitrary bytes as a .cact container (needle_model_load_memory). A refusal
// must be NEEDLE_E_FORMAT or NEEDLE_E_UNSUPPORTED with a message and a NULL model; a model that
// loads must run a state, a prefill (sequential and batched, same bits), decode steps with
// finite logits, and its tokenizer (if any) must round-trip text to valid UTF-8.
// A structure-aware mutator (below) overwrites single header words, directory record fields,
// tokenizer fields or payload bytes in place three times out of four, so most mutants keep a
// valid layout and reach the later checks and the forward pass; libFuzzer's own mutations do
// the rest (insertions, deletions, splices).
#include <algorithm>
#include <random>
#include <vector>

#include "fuzz_common.h"

namespace {

// A host would not create a state it cannot afford; neither does the fuzzer (the KV ring of a
// legitimately huge model, e.g. max_seq_len 2^20 with full causal attention, is not a bug).
constexpr uint64_t kStateBudget = uint64_t(256) << 20;

uint64_t state_bytes(const needle_model_info &i) {
    // Needle 3 global layers keep max_seq_len positions whatever the window: bound by that.
    const uint64_t ring = i.kv_window && i.format_version != 3 ? i.kv_window : i.max_seq_len;
    return uint64_t(i.num_layers) * i.num_kv_heads * ring * (i.head_dim + i.v_head_dim) * 4 +
           uint64_t(i.max_seq_len) * 8 + uint64_t(i.vocab_size) * 16;
}

void run_model(needle_model *m) {
    needle_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (needle_model_get_info(m, &info) != NEEDLE_OK) fuzz_fail("get_info failed: %s", needle_last_error());
    const uint32_t V = info.vocab_size, T = info.max_seq_len;
    if (V == 0 || T == 0) fuzz_fail("vocab_size %u, max_seq_len %u", V, T);

    if (info.has_tokenizer) {
        static const char text[] = "Hi there, <|im_start|>user\n\xE6\x97\xA5\xF0\x9F\x98\x80 \x01";
        uint32_t ids[256];
        size_t n = 0;
        needle_status st = needle_model_tokenize(m, text, sizeof text - 1, 1, ids, 256, &n);
        if (st != NEEDLE_OK) fuzz_fail("tokenize: %s", needle_last_error());
        for (size_t i = 0; i < n; ++i)
            if (ids[i] >= V) fuzz_fail("tokenize gave id %u >= vocab %u", ids[i], V);
        char out[2048];
        size_t len = 0;
        st = needle_model_detokenize(m, ids, n, out, sizeof out, &len);
        if (st != NEEDLE_OK && st != NEEDLE_E_BUFFER_TOO_SMALL) fuzz_fail("detokenize: %s", needle_last_error());
        if (st == NEEDLE_OK && !fuzz_utf8(out, len)) fuzz_fail("detokenize gave invalid UTF-8");
    }

    if (state_bytes(info) > kStateBudget) return;
    needle_state *s = nullptr, *s2 = nullptr;
    needle_batch *b = nullptr;
    needle_status st = needle_state_create(m, &s);
    if (st != NEEDLE_OK) fuzz_fail("state_create: %s", needle_last_error());
    if (needle_state_create(m, &s2) != NEEDLE_OK) fuzz_fail("state_create 2: %s", needle_last_error());
    if (needle_batch_create(m, std::min<uint32_t>(T, 2), &b) != NEEDLE_OK) fuzz_fail("batch: %s", needle_last_error());
    std::vector<float> lg(V), lg2(V);
    uint32_t prompt[3];
    const uint32_t np = std::min<uint32_t>(3, T);
    for (uint32_t i = 0; i < np; ++i) prompt[i] = (i == 0 && info.bos_id < V) ? info.bos_id : (7 * i + 1) % V;
    if (needle_state_prefill(s, nullptr, prompt, np, lg.data(), V) != NEEDLE_OK) fuzz_fail("prefill: %s", needle_last_error());
    if (needle_state_prefill(s2, b, prompt, np, lg2.data(), V) != NEEDLE_OK) fuzz_fail("batched prefill: %s", needle_last_error());
    if (!fuzz_all_finite(lg.data(), V)) fuzz_fail("prefill logits are not finite");
    if (std::memcmp(lg.data(), lg2.data(), sizeof(float) * V) != 0) fuzz_fail("batched prefill differs");
    for (int k = 0; k < 3 && needle_state_pos(s) < T; ++k) {
        const uint32_t next = uint32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
        if (needle_state_decode(s, next, lg.data(), V) != NEEDLE_OK) fuzz_fail("decode: %s", needle_last_error());
        if (!fuzz_all_finite(lg.data(), V)) fuzz_fail("decode logits are not finite");
    }
    if (needle_state_pos(s) == T && needle_state_decode(s, 0, nullptr, 0) != NEEDLE_E_CONTEXT_FULL)
        fuzz_fail("decode past max_seq_len is not CONTEXT_FULL");
    needle_batch_free(b);
    needle_state_free(s2);
    needle_state_free(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = 1;  // no worker threads: faster and deterministic executions
    needle_model *m = reinterpret_cast<needle_model *>(uintptr_t(1));
    const needle_status st = needle_model_load_memory(data, size, &p, &m);
    if (st != NEEDLE_OK) {
        if (m != nullptr) fuzz_fail("a failed load wrote a model");
        fuzz_expect_refusal(st, {NEEDLE_E_FORMAT, NEEDLE_E_UNSUPPORTED}, "needle_model_load_memory");
        return 0;
    }
    if (!m) fuzz_fail("NEEDLE_OK with a NULL model");
    run_model(m);
    needle_model_free(m);
    return 0;
}

// ---------------------------------------------------------------- structure-aware mutation

extern "C" size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

namespace {

uint64_t get_le(const uint8_t *p, int w) {
    uint64_t v = 0;
    for (int i = 0; i < w; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}
void put_le(uint8_t *p, int w, uint64_t v) {
    for (int i = 0; i < w; ++i) p[i] = uint8_t(v >> (8 * i));
}

// Overwrites the w-byte field at p with a value chosen the way the corruption suite does.
void mutate_field(uint8_t *p, int w, std::minstd_rand &rng) {
    const uint64_t orig = get_le(p, w), mx = w == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * w)) - 1;
    uint64_t v;
    switch (rng() % 9) {
        case 0: v = 0; break;
        case 1: v = 1; break;
        case 2: v = mx; break;
        case 3: v = orig + 1; break;
        case 4: v = orig - 1; break;
        case 5: v = orig * 2; break;
        case 6: v = orig / 2; break;
        case 7: v = uint64_t(rng()) | uint64_t(rng()) << 32; break;
        default: v = orig ^ (uint64_t(1) << (rng() % (8 * w))); break;
    }
    put_le(p, w, v & mx);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    std::minstd_rand rng(seed);
    if (size < 232 || rng() % 4 == 0) return LLVMFuzzerMutate(data, size, max_size);
    const uint32_t n = uint32_t(get_le(data + 4, 4));
    const uint64_t dir_end = 232 + 44ull * n;
    const bool dir_ok = n > 0 && dir_end <= size;
    switch (rng() % 5) {
        case 0:  // a header word (or rope_theta)
            mutate_field(data + 4 * (rng() % 30), 4, rng);
            break;
        case 1:  // a codebook level
            mutate_field(data + 120 + 4 * (rng() % 28), 4, rng);
            break;
        case 2:
            if (dir_ok) {  // one field of one directory record
                static const int off[11] = {0, 1, 2, 4, 8, 12, 16, 20, 28, 36, 40};
                static const int width[11] = {1, 1, 2, 4, 4, 4, 4, 8, 8, 4, 4};
                const int f = int(rng() % 11);
                mutate_field(data + 232 + 44 * (rng() % n) + off[f], width[f], rng);
                break;
            }
            [[fallthrough]];
        case 3:
            if (dir_ok && data[dir_end - 44] == 4) {  // the tokenizer blob's header or early pieces
                const uint64_t o = get_le(data + dir_end - 44 + 20, 8), nb = get_le(data + dir_end - 44 + 28, 8);
                if (o < size && nb >= 24 && o + nb <= size) {
                    const uint64_t span = std::min<uint64_t>(nb, 24 + 7 * 32);
                    const int w = 1 << (rng() % 3);
                    const uint64_t at = o + rng() % (span - uint64_t(w) + 1);
                    mutate_field(data + at, w, rng);
                    break;
                }
            }
            [[fallthrough]];
        default: {  // a bit of the payload (past the directory)
            const uint64_t lo = dir_ok ? dir_end : 232;
            if (lo < size) data[lo + rng() % (size - lo)] ^= uint8_t(1u << (rng() % 8));
            break;
        }
    }
    return size;
}
