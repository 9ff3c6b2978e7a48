// Corruption suite (issue #4 "no input can crash the host process"): every header word, every
// field of every directory record, the tokenizer blob's header and first piece records, payload
// bits, truncations and trailing bytes of each fixture container and of edge-geometry containers
// made with the writer. Each mutated file goes through needle_model_load_memory and must either
// be refused with NEEDLE_E_FORMAT / NEEDLE_E_UNSUPPORTED and a specific message, or load a model
// that then runs (state, prefill, 4 decode steps with finite logits, a batched prefill with the
// same bits, tokenizer round trips, a short generation) without a fault. Sampling is
// deterministic; each TEST_CASE prints its counts with MESSAGE.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cact_writer.h"
#include "fixtures.h"
#include "needle.h"
#include "tokenizer/tokenizer.h"

namespace {

// ---------------------------------------------------------------- little-endian helpers

uint64_t get_le(const std::vector<uint8_t> &b, uint64_t off, int width) {
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= uint64_t(b[off + uint64_t(i)]) << (8 * i);
    return v;
}
void put_le(std::vector<uint8_t> &b, uint64_t off, int width, uint64_t v) {
    for (int i = 0; i < width; ++i) b[off + uint64_t(i)] = uint8_t(v >> (8 * i));
}
uint64_t mask_of(int width) { return width == 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * width)) - 1; }

// ---------------------------------------------------------------- verdicts

enum class Want { Either, Refuse };

struct Tally {
    size_t total = 0, refused = 0, ran = 0, failed = 0;
    double seconds_refused = 0, seconds_ran = 0;
    std::map<int, size_t> by_status;       // refusals per status
    std::map<std::string, size_t> by_kind;  // cases per mutation kind
    std::vector<std::string> failures;      // first few, for the report
    void fail(const std::string &label, const std::string &why) {
        ++failed;
        if (failures.size() < 40) failures.push_back(label + ": " + why);
    }
    void add(const Tally &o) {
        total += o.total, refused += o.refused, ran += o.ran, failed += o.failed;
        for (const auto &kv : o.by_status) by_status[kv.first] += kv.second;
        for (const auto &kv : o.by_kind) by_kind[kv.first] += kv.second;
        for (const std::string &f : o.failures)
            if (failures.size() < 40) failures.push_back(f);
    }
};

bool all_finite(const std::vector<float> &v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

std::string status_text(needle_status st) {
    return std::to_string(st) + " (" + needle_status_string(st) + "): " + needle_last_error();
}

struct Piece {
    std::string text;
    bool utf8 = true;
};

int collect_piece(uint32_t, const char *text, size_t len, void *user) {
    auto *v = static_cast<std::vector<Piece> *>(user);
    v->push_back({std::string(text, len), needle::utf8_valid(std::string_view(text, len)) && text[len] == '\0'});
    return 0;
}

// Runs a loaded model; returns "" when everything behaved, else what went wrong.
std::string exercise(needle_model *m, bool light) {
    needle_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (needle_model_get_info(m, &info) != NEEDLE_OK) return "get_info: " + status_text(NEEDLE_E_INTERNAL);
    const uint32_t V = info.vocab_size, T = info.max_seq_len;
    if (V == 0 || T == 0) return "info reports vocab_size or max_seq_len 0";

    needle_state *s = nullptr;
    needle_status st = needle_state_create(m, &s);
    if (st != NEEDLE_OK) return "state_create: " + status_text(st);
    std::unique_ptr<needle_state, void (*)(needle_state *)> sh(s, needle_state_free);

    // Prefill a few tokens (fewer when max_seq_len is tiny), then up to 4 greedy decode steps.
    std::vector<uint32_t> prompt;
    const uint32_t first = info.has_tokenizer && info.bos_id < V ? info.bos_id : 0;
    for (uint32_t i = 0; i < std::min<uint32_t>(3, T); ++i) prompt.push_back(i == 0 ? first : (7 * i + 1) % V);
    std::vector<float> lg(V, -1.0f), lg_batched(V, -2.0f);
    st = needle_state_prefill(s, nullptr, prompt.data(), prompt.size(), lg.data(), V);
    if (st != NEEDLE_OK) return "prefill: " + status_text(st);
    if (!all_finite(lg)) return "prefill logits are not finite";
    if (!light) {  // the same prompt through a batch of capacity 2 (chunks 2 + 1) gives the same bits
        needle_batch *b = nullptr;
        needle_state *s2 = nullptr;
        st = needle_batch_create(m, std::min<uint32_t>(2, T), &b);
        if (st != NEEDLE_OK) return "batch_create: " + status_text(st);
        std::unique_ptr<needle_batch, void (*)(needle_batch *)> bh(b, needle_batch_free);
        st = needle_state_create(m, &s2);
        if (st != NEEDLE_OK) return "second state_create: " + status_text(st);
        std::unique_ptr<needle_state, void (*)(needle_state *)> s2h(s2, needle_state_free);
        st = needle_state_prefill(s2, b, prompt.data(), prompt.size(), lg_batched.data(), V);
        if (st != NEEDLE_OK) return "batched prefill: " + status_text(st);
        if (std::memcmp(lg.data(), lg_batched.data(), sizeof(float) * V) != 0)
            return "batched prefill logits differ from the sequential ones";
    }
    for (int k = 0; k < 4 && needle_state_pos(s) < T; ++k) {
        const uint32_t next = uint32_t(std::max_element(lg.begin(), lg.end()) - lg.begin());
        st = needle_state_decode(s, next, lg.data(), V);
        if (st != NEEDLE_OK) return "decode: " + status_text(st);
        if (!all_finite(lg)) return "decode logits are not finite";
    }
    if (needle_state_pos(s) == T && needle_state_decode(s, 0, nullptr, 0) != NEEDLE_E_CONTEXT_FULL)
        return "decode at max_seq_len is not CONTEXT_FULL";

    uint32_t ids[512];
    size_t n = 0;
    const std::string text = "Hello, world! <|im_start|>user\n\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 x\x01y  z";
    st = needle_model_tokenize(m, text.data(), text.size(), 1, ids, 512, &n);
    if (!info.has_tokenizer) return st == NEEDLE_E_UNSUPPORTED ? "" : "tokenize without tokenizer: " + status_text(st);
    if (st != NEEDLE_OK) return "tokenize: " + status_text(st);
    for (size_t i = 0; i < n; ++i)
        if (ids[i] >= V) return "tokenize produced id " + std::to_string(ids[i]) + " >= vocab";
    std::vector<uint32_t> all(std::min<uint32_t>(V, 2048));
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    for (const auto &seq : {std::vector<uint32_t>(ids, ids + n), all}) {
        size_t len = 0;
        st = needle_model_detokenize(m, seq.data(), seq.size(), nullptr, 0, &len);
        if (st != NEEDLE_E_BUFFER_TOO_SMALL) return "detokenize size query: " + status_text(st);
        std::string out(len + 1, 'x');
        size_t len2 = 0;
        st = needle_model_detokenize(m, seq.data(), seq.size(), &out[0], out.size(), &len2);
        if (st != NEEDLE_OK || len2 != len) return "detokenize: " + status_text(st);
        if (!needle::utf8_valid(std::string_view(out.data(), len))) return "detokenize gave invalid UTF-8";
    }
    if (light) return "";
    // A short sampled generation streams whole UTF-8 pieces (or the prompt does not fit).
    needle_state *g = nullptr;
    if (needle_state_create(m, &g) != NEEDLE_OK) return "state for generate: " + status_text(st);
    std::unique_ptr<needle_state, void (*)(needle_state *)> gh(g, needle_state_free);
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 3;
    gp.temperature = 0.8f;
    gp.top_k = 8;
    gp.seed = 5;
    std::vector<Piece> pieces;
    st = needle_generate(g, nullptr, "Hi", 2, &gp, collect_piece, &pieces, nullptr);
    if (st != NEEDLE_OK && st != NEEDLE_E_CONTEXT_FULL) return "generate: " + status_text(st);
    for (const Piece &p : pieces)
        if (!p.utf8) return "generate streamed a piece that is not whole UTF-8";
    return "";
}

constexpr uint32_t kPrimeAbi = 0x7A11u;
bool g_light_run = false;  // set per source from Plan::light_run

void run_case(const uint8_t *data, size_t size, const std::string &kind, const std::string &label, Want want,
              Tally &t) {
    ++t.total;
    ++t.by_kind[kind];
    static const bool trace = std::getenv("NEEDLE_CORRUPTION_TRACE") != nullptr;
    if (trace) std::fprintf(stderr, "case %s\n", label.c_str());
    needle_check_abi(kPrimeAbi);  // a known message, so a refusal must write its own
    const std::string primed = needle_last_error();
    needle_model *m = reinterpret_cast<needle_model *>(uintptr_t(0x1234));
    const auto t0 = std::chrono::steady_clock::now();
    struct Clock {
        std::chrono::steady_clock::time_point t0;
        double *sink;
        ~Clock() { *sink += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    };
    const needle_status st = needle_model_load_memory(data, size, nullptr, &m);
    Clock clock{t0, st == NEEDLE_OK ? &t.seconds_ran : &t.seconds_refused};
    if (st != NEEDLE_OK) {
        const std::string msg = needle_last_error();
        if (m != nullptr) t.fail(label, "failed load left a non-NULL model");
        if (st != NEEDLE_E_FORMAT && st != NEEDLE_E_UNSUPPORTED)
            t.fail(label, "refused with " + status_text(st));
        else if (msg.empty() || msg == primed || msg == needle_status_string(st) || msg.size() < 16)
            t.fail(label, "refusal without a specific message: \"" + msg + "\"");
        else
            ++t.refused, ++t.by_status[st];
        return;
    }
    if (!m) {
        t.fail(label, "NEEDLE_OK with a NULL model");
        return;
    }
    std::unique_ptr<needle_model, void (*)(needle_model *)> mh(m, needle_model_free);
    if (want == Want::Refuse) {
        t.fail(label, "loaded, but must be refused");
        return;
    }
    const std::string why = exercise(m, g_light_run);
    if (why.empty())
        ++t.ran;
    else
        t.fail(label, "loaded but " + why);
}

// ---------------------------------------------------------------- container layout (test-local)

struct Record {
    uint64_t at;  // file offset of the 44-byte record
    uint8_t dtype;
    uint64_t offset, nbytes;
};

struct Layout {
    uint32_t num_tensors = 0;
    uint64_t dir_start = 232, dir_end = 0;
    std::vector<Record> recs;
    bool has_tok = false;
    uint64_t tok_off = 0, tok_bytes = 0;
};

Layout layout_of(const std::vector<uint8_t> &b) {
    Layout l;
    REQUIRE(b.size() >= 232);
    l.num_tensors = uint32_t(get_le(b, 4, 4));
    l.dir_end = l.dir_start + 44ull * l.num_tensors;
    REQUIRE(l.dir_end <= b.size());
    for (uint32_t i = 0; i < l.num_tensors; ++i) {
        const uint64_t at = l.dir_start + 44ull * i;
        l.recs.push_back({at, b[at], get_le(b, at + 20, 8), get_le(b, at + 28, 8)});
    }
    REQUIRE(!l.recs.empty());
    if (l.recs.back().dtype == 4) {
        l.has_tok = true;
        l.tok_off = l.recs.back().offset;
        l.tok_bytes = l.recs.back().nbytes;
    }
    return l;
}

// ---------------------------------------------------------------- mutation values

struct Field {
    uint64_t off;
    int width;  // bytes: 1, 2, 4 or 8
    std::string name;
    bool is_f32 = false;
};

// Values to write into a field: 0, 1, max, max-1, +-1 and single bit flips at sampled positions
// (every bit of a byte; spread positions of wider fields). `full` false gives a reduced set.
std::vector<uint64_t> values_for(uint64_t orig, const Field &f, bool full) {
    const uint64_t mx = mask_of(f.width);
    std::vector<uint64_t> v{0, 1, mx, mx - 1, (orig + 1) & mx, (orig - 1) & mx};
    std::vector<int> bits;
    switch (f.width) {
        case 1: bits = {0, 1, 2, 3, 4, 5, 6, 7}; break;
        case 2: bits = {0, 1, 3, 6, 8, 11, 15}; break;
        case 4: bits = {0, 1, 2, 3, 5, 8, 11, 16, 19, 23, 24, 27, 30, 31}; break;
        default: bits = {0, 1, 3, 7, 12, 20, 31, 32, 40, 47, 56, 63}; break;
    }
    if (!full) {
        v = {0, 1, mx, (orig + 1) & mx, (orig - 1) & mx};
        bits = {0, f.width * 4, f.width * 8 - 1};
    }
    for (int b : bits) v.push_back(orig ^ (uint64_t(1) << b));
    if (f.is_f32) {  // NaN, +-inf, -1, 1, a huge and a tiny normal value
        for (uint64_t x : {0x7FC00000ull, 0x7F800000ull, 0xFF800000ull, 0xBF800000ull, 0x3F800000ull,
                           0x7F7FFFFFull, 0x00800000ull})
            v.push_back(x);
    }
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    v.erase(std::remove(v.begin(), v.end(), orig), v.end());
    return v;
}

const char *const kHeaderWords[30] = {
    "tag", "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab_size", "d_model", "num_heads",
    "num_kv_heads", "num_layers", "head_dim", "max_seq_len", "hada_n", "mhc_lanes", "engram_slots",
    "engram_sub_dim", "num_engram_tables", "engram_conv_taps", "engram_conv_dilation", "num_engram_orders",
    "engram_orders[0]", "engram_orders[1]", "engram_orders[2]", "engram_orders[3]", "num_engram_sites",
    "engram_sites[0]", "engram_sites[1]", "engram_sites[2]", "engram_sites[3]", "rope_theta"};

// Deterministic sampler (splitmix64).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};

// ---------------------------------------------------------------- one source, every kind

struct Plan {
    bool full = true;               // every value of every field
    std::vector<uint32_t> records;  // directory records to mutate (empty = all)
    uint32_t tok_pieces = 16;       // first piece records of the tokenizer blob
    uint32_t payload_flips = 96;
    uint32_t truncations_per_record = 3;  // boundary, mid-blob, end-1 per record (sampled records)
    uint32_t codebook_stride = 1;         // mutate every n-th codebook level
    bool light_run = false;               // loaded models: no batched prefill and no generation
};

void mutate_field(std::vector<uint8_t> &work, const Field &f, bool full, const std::string &kind,
                  const std::string &where, Tally &t) {
    const uint64_t orig = get_le(work, f.off, f.width);
    for (uint64_t v : values_for(orig, f, full)) {
        put_le(work, f.off, f.width, v);
        run_case(work.data(), work.size(), kind, where + " " + f.name + " = " + std::to_string(v), Want::Either, t);
    }
    put_le(work, f.off, f.width, orig);
}

Tally corrupt(const std::string &name, const std::vector<uint8_t> &src, const Plan &plan) {
    Tally t;
    g_light_run = plan.light_run;
    // The unmodified source must load and run, else every other verdict means nothing.
    {
        Tally base;
        run_case(src.data(), src.size(), "original", name + " original", Want::Either, base);
        INFO(name << ": " << (base.failures.empty() ? std::string("refused: ") + needle_last_error() : base.failures[0]));
        REQUIRE(base.ran == 1);
    }
    const Layout lay = layout_of(src);
    std::vector<uint8_t> work = src;

    // Header: 29 u32 words and the f32 rope_theta.
    for (int w = 0; w < 30; ++w)
        mutate_field(work, Field{uint64_t(4 * w), 4, kHeaderWords[w], w == 29}, plan.full, "header", name + " header", t);
    // Codebook: each of the 28 levels, reduced value set.
    for (int k = 0; k < 28; k += int(plan.codebook_stride))
        mutate_field(work, Field{uint64_t(120 + 4 * k), 4, "level " + std::to_string(k), true}, false, "codebook",
                     name + " codebook", t);

    // Directory records: every field.
    std::vector<uint32_t> recs = plan.records;
    if (recs.empty())
        for (uint32_t i = 0; i < lay.num_tensors; ++i) recs.push_back(i);
    for (uint32_t i : recs) {
        const uint64_t at = lay.recs[i].at;
        const std::string where = name + " record " + std::to_string(i);
        const Field fields[] = {{at + 0, 1, "dtype"},         {at + 1, 1, "ndim"},
                                {at + 2, 2, "_pad"},          {at + 4, 4, "shape[0]"},
                                {at + 8, 4, "shape[1]"},      {at + 12, 4, "shape[2]"},
                                {at + 16, 4, "shape[3]"},     {at + 20, 8, "offset"},
                                {at + 28, 8, "nbytes"},       {at + 36, 4, "group"},
                                {at + 40, 4, "bits"}};
        for (const Field &f : fields) mutate_field(work, f, plan.full, "directory", where, t);
    }

    // Tokenizer blob: its 24-byte header, then the first piece records' score, type and length.
    if (lay.has_tok && lay.tok_bytes >= 24) {
        const uint64_t b = lay.tok_off;
        const Field head[] = {{b + 0, 4, "n_pieces"}, {b + 4, 4, "pad_id"},          {b + 8, 4, "eos_id"},
                              {b + 12, 4, "bos_id"},  {b + 16, 4, "unk_id"},         {b + 20, 1, "add_dummy_prefix"},
                              {b + 21, 1, "byte_fallback"}, {b + 22, 2, "_pad"}};
        for (const Field &f : head) mutate_field(work, f, plan.full, "tokenizer", name + " tokenizer", t);
        uint64_t p = b + 24;
        for (uint32_t id = 0; id < plan.tok_pieces && p + 7 <= b + lay.tok_bytes; ++id) {
            const uint64_t len = get_le(work, p + 5, 2);
            const std::string where = name + " tokenizer piece " + std::to_string(id);
            mutate_field(work, Field{p + 4, 1, "type"}, plan.full, "tokenizer", where, t);
            mutate_field(work, Field{p + 5, 2, "len"}, plan.full, "tokenizer", where, t);
            mutate_field(work, Field{p + 0, 4, "score", true}, false, "tokenizer", where, t);
            if (len > 0) mutate_field(work, Field{p + 7, 1, "surface[0]"}, false, "tokenizer", where, t);
            p += 7 + len;
        }
    }

    // Payload: single bit flips at sampled positions inside the blobs (tokenizer excluded).
    Rng rng{0xC0FFEEull ^ src.size()};
    const size_t model_recs = lay.has_tok ? lay.recs.size() - 1 : lay.recs.size();
    for (uint32_t k = 0; k < plan.payload_flips; ++k) {
        const Record &r = lay.recs[rng.below(model_recs)];
        if (r.nbytes == 0) continue;
        const uint64_t at = r.offset + rng.below(r.nbytes);
        const uint8_t bit = uint8_t(1u << rng.below(8));
        work[at] ^= bit;
        run_case(work.data(), work.size(), "payload", name + " payload byte " + std::to_string(at) + " ^ " +
                 std::to_string(bit), Want::Either, t);
        work[at] ^= bit;
    }

    // Truncation: always refused.
    std::vector<uint64_t> cuts{0, 1, 4, 119, 120, 121, 176, 231, 232, 232 + 22, lay.dir_end - 1, lay.dir_end,
                               (lay.dir_end + 63) & ~uint64_t(63), src.size() - 1};
    for (size_t k = 0; k < recs.size(); k += std::max<size_t>(1, recs.size() / 24)) {
        cuts.push_back(lay.dir_start + 44ull * recs[k] + 5);  // mid-record
    }
    Rng trng{0x7E57ull ^ src.size()};
    for (uint32_t i = 0; i < lay.recs.size(); ++i) {
        const Record &r = lay.recs[i];
        const bool sampled = plan.records.empty() ||
                             std::find(plan.records.begin(), plan.records.end(), i) != plan.records.end();
        if (!sampled) continue;
        cuts.push_back(r.offset);  // region boundary: the blob's first byte is missing
        if (plan.truncations_per_record >= 2 && r.nbytes > 1) cuts.push_back(r.offset + r.nbytes / 2);
        if (plan.truncations_per_record >= 3 && r.nbytes > 2) cuts.push_back(r.offset + 1 + trng.below(r.nbytes - 1));
        cuts.push_back(r.offset + r.nbytes - 1);
    }
    if (lay.has_tok) {  // mid-blob of the tokenizer: header, first records, half, last byte
        for (uint64_t o : {uint64_t(1), uint64_t(20), uint64_t(24), uint64_t(27), uint64_t(31), lay.tok_bytes / 2})
            if (o < lay.tok_bytes) cuts.push_back(lay.tok_off + o);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (uint64_t c : cuts) {
        if (c >= src.size()) continue;
        run_case(src.data(), size_t(c), "truncation", name + " truncated to " + std::to_string(c), Want::Refuse, t);
    }

    // Trailing bytes: always refused (the file must end at the last blob).
    const std::vector<std::vector<uint8_t>> tails{{0}, {0xFF}, std::vector<uint8_t>(63, 0), std::vector<uint8_t>(64, 0),
                                                  std::vector<uint8_t>(src.begin(), src.begin() + 120)};
    for (size_t k = 0; k < tails.size(); ++k) {
        std::vector<uint8_t> longer = src;
        longer.insert(longer.end(), tails[k].begin(), tails[k].end());
        run_case(longer.data(), longer.size(), "trailing", name + " + " + std::to_string(tails[k].size()) +
                 " trailing bytes", Want::Refuse, t);
    }
    {
        std::vector<uint8_t> noise(4096);
        for (uint8_t &x : noise) x = uint8_t(rng.next());
        std::vector<uint8_t> longer = src;
        longer.insert(longer.end(), noise.begin(), noise.end());
        run_case(longer.data(), longer.size(), "trailing", name + " + 4096 random bytes", Want::Refuse, t);
    }
    return t;
}

void report(const std::string &name, const Tally &t) {
    std::string kinds, statuses;
    for (const auto &kv : t.by_kind) kinds += (kinds.empty() ? "" : ", ") + kv.first + " " + std::to_string(kv.second);
    for (const auto &kv : t.by_status)
        statuses += (statuses.empty() ? "" : ", ") + std::string(kv.first == NEEDLE_E_FORMAT ? "FORMAT " : "UNSUPPORTED ") +
                    std::to_string(kv.second);
    MESSAGE("corruption: " << name << ": " << t.total << " cases, " << t.refused << " refused (" << statuses << "), "
                           << t.ran << " loaded and ran, " << t.failed << " failed [" << kinds << "]; "
                           << t.seconds_refused << " s in refusals, " << t.seconds_ran << " s in loads and runs");
    std::string list;
    for (const std::string &f : t.failures) list += "\n  " + f;
    INFO("failures:" << list);
    CHECK(t.failed == 0);
    CHECK(t.total == t.refused + t.ran + t.failed);
    CHECK(t.refused > 0);
}

void run_source(const std::string &name, const std::vector<uint8_t> &bytes, const Plan &plan) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tally t = corrupt(name, bytes, plan);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("corruption: " << name << ": " << bytes.size() << "-byte container, " << s << " s");
    report(name, t);
}

std::vector<uint8_t> fixture(const std::string &name) { return fixtures::read_bytes(fixtures::v2("models/" + name + ".cact")); }

// Edge geometries made with the writer.
needle::writer::Geometry edge_vocab1() {
    needle::writer::Geometry g = needle::writer::preset("tiny-edge");
    g.vocab_size = 1;
    g.with_tokenizer = false;
    return g;
}

needle::writer::Geometry edge_ternary_g8() {
    needle::writer::Geometry g;
    g.vocab_size = 300;
    g.d_model = 40;  // not a power of two
    g.num_heads = 2;
    g.num_kv_heads = 1;
    g.head_dim = 6;
    g.num_layers = 2;
    g.max_seq_len = 24;
    g.kv_window = 0;  // "size from the KV budget"
    g.mhc_lanes = 2;
    g.engram_slots = 7;
    g.engram_sub_dim = 12;
    g.engram_heads = 1;
    g.engram_orders = {1, 4};
    g.engram_sites = {1};
    g.engram_conv_taps = 3;
    g.group = 8;
    g.bits_embedding = 3;
    g.bits_mhc = 5;
    g.bits_default = 5;
    g.with_heads = true;
    return g;
}

needle::writer::Geometry edge_3bit() {
    needle::writer::Geometry g;
    g.vocab_size = 290;
    g.d_model = 33;  // odd
    g.num_heads = 3;
    g.num_kv_heads = 3;
    g.head_dim = 4;
    g.num_layers = 2;
    g.max_seq_len = 40;
    g.kv_window = 5;
    g.mhc_lanes = 3;
    g.engram_slots = 13;
    g.engram_sub_dim = 5;
    g.engram_heads = 2;
    g.engram_orders = {3};
    g.engram_sites = {1, 0};
    g.engram_conv_taps = 2;
    g.group = 16;
    g.bits_embedding = 3;
    g.bits_mhc = 3;
    g.bits_default = 3;
    g.with_heads = true;
    return g;
}

}  // namespace

TEST_CASE("corruption: fixture tiny") { run_source("tiny", fixture("tiny"), Plan{}); }

TEST_CASE("corruption: fixture odd") { run_source("odd", fixture("odd"), Plan{}); }

TEST_CASE("corruption: fixture ternary") { run_source("ternary", fixture("ternary"), Plan{}); }

TEST_CASE("corruption: fixture needle2 (reduced)") {
    // 13 MB: a reduced value set, and records of every kind: embedding, a norm, q/k projections,
    // attn_gate, the last layer's d3, mHC (a_pre, b_res, phi_res), both engram sites' tables and
    // taps, final_norm, the head manifest, a head's probes/proj and the tokenizer.
    Plan p;
    p.full = false;
    p.records = {0, 1, 2, 3, 10, 378, 379, 384, 387, 388, 391, 392, 396, 397, 398, 399, 403, 404};
    p.tok_pieces = 4;
    p.payload_flips = 12;
    p.truncations_per_record = 2;
    p.codebook_stride = 9;  // levels 0, 9, 18, 27: one of each book
    p.light_run = true;
    if (fixtures::kSanitized) {  // ~20x slower: one record of each kind, fewer pieces and payload flips
        p.records = {0, 2, 10, 379, 387, 388, 391, 396, 397, 404};
        p.tok_pieces = 2;
        p.payload_flips = 4;
        p.codebook_stride = 27;
    }
    run_source("needle2", fixture("needle2"), p);
}

TEST_CASE("corruption: writer tiny-edge (1 layer, 1 head, 1 lane, no engram sites, d_model 24)") {
    run_source("tiny-edge", needle::writer::write_cact_v2(needle::writer::preset("tiny-edge"), 3), Plan{});
}

TEST_CASE("corruption: writer vocab 1 without tokenizer") {
    run_source("vocab1", needle::writer::write_cact_v2(edge_vocab1(), 4), Plan{});
}

TEST_CASE("corruption: writer ternary, 3-bit embedding, group 8, d_model 40, heads") {
    run_source("ternary-g8", needle::writer::write_cact_v2(edge_ternary_g8(), 5), Plan{});
}

TEST_CASE("corruption: writer 3-bit, group 16, d_model 33, 3 lanes, two sites") {
    run_source("3bit-g16", needle::writer::write_cact_v2(edge_3bit(), 6), Plan{});
}

// ---------------------------------------------------------------- regressions found by this suite

namespace {

size_t rss_bytes() {
    std::FILE *f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, resident = 0;
    const int got = std::fscanf(f, "%lu %lu", &size, &resident);
    std::fclose(f);
    return got == 2 ? size_t(resident) * size_t(4096) : 0;
}

std::string load_error(const std::vector<uint8_t> &b, needle_status want) {
    needle_model *m = nullptr;
    const needle_status st = needle_model_load_memory(b.data(), b.size(), nullptr, &m);
    needle_model_free(m);
    CHECK(st == want);
    return needle_last_error();
}

}  // namespace

TEST_CASE("corruption: regression: engram header fields of a model without sites size nothing") {
    // tiny-edge has no engram sites, so num_engram_tables / engram_sub_dim are unchecked (rule 7).
    // They used to size every workspace (T * sub floats, wrapping in 32 bits): state_create asked
    // for up to 34 GB (NO_MEMORY, or the OOM killer when overcommit let it through).
    const std::vector<uint8_t> src = needle::writer::write_cact_v2(needle::writer::preset("tiny-edge"), 3);
    REQUIRE(get_le(src, 96, 4) == 0);  // num_engram_sites
    for (const auto &patch : std::vector<std::pair<uint64_t, uint64_t>>{
             {64, 0xFFFFFFFFull}, {64, 1u << 20}, {60, 0x80000040ull}, {60, 1u << 27}}) {
        std::vector<uint8_t> b = src;
        put_le(b, patch.first, 4, patch.second);
        if (patch.first == 60) put_le(b, 64, 4, 64);  // sub * tables past 2^32
        CAPTURE(patch.first);
        CAPTURE(patch.second);
        needle_model *m = nullptr;
        REQUIRE(needle_model_load_memory(b.data(), b.size(), nullptr, &m) == NEEDLE_OK);
        std::unique_ptr<needle_model, void (*)(needle_model *)> mh(m, needle_model_free);
        const size_t before = rss_bytes();
        needle_state *s = nullptr;
        needle_batch *bt = nullptr;
        REQUIRE(needle_state_create(m, &s) == NEEDLE_OK);
        REQUIRE(needle_batch_create(m, 64, &bt) == NEEDLE_OK);
        const size_t grown = rss_bytes() - before;
        CHECK(grown < (size_t(16) << 20));
        CHECK(exercise(m, false) == "");
        needle_batch_free(bt);
        needle_state_free(s);
    }
}

TEST_CASE("corruption: regression: a codebook level far from the reference book is refused") {
    // 0x7F7FFFFF (FLT_MAX) in the last level of a book keeps every book finite and ascending, so
    // rules 11's first checks passed; the CQ dots then overflowed and the logits were NaN.
    for (const std::string name : {"tiny", "odd"}) {
        for (int level : {3, 11, 27}) {
            std::vector<uint8_t> b = fixture(name);
            put_le(b, 120 + 4 * uint64_t(level), 4, 0x7F7FFFFFull);
            CAPTURE(name);
            CAPTURE(level);
            const std::string msg = load_error(b, NEEDLE_E_FORMAT);
            CHECK(msg.find("codebook") != std::string::npos);
            CHECK(msg.find("reference unit level") != std::string::npos);
        }
        // A last-bit change is within the tolerance and loads.
        std::vector<uint8_t> b = fixture(name);
        b[120] ^= 1;
        needle_model *m = nullptr;
        CHECK(needle_model_load_memory(b.data(), b.size(), nullptr, &m) == NEEDLE_OK);
        needle_model_free(m);
    }
    // Other group sizes scale the books by 1/sqrt(G): the writer's group 8, 16 and 32 files load.
    for (const auto &g : {edge_ternary_g8(), edge_3bit(), needle::writer::preset("tiny-edge")}) {
        const std::vector<uint8_t> b = needle::writer::write_cact_v2(g, 9);
        needle_model *m = nullptr;
        CHECK(needle_model_load_memory(b.data(), b.size(), nullptr, &m) == NEEDLE_OK);
        needle_model_free(m);
    }
}

TEST_CASE("corruption: regression: a rope_theta whose RoPE angles overflow float is refused") {
    // rope_theta = 1e-45 (bit pattern 1) is finite and > 0 (rule 9), but with head_dim 32 the
    // last frequency 1/theta^(30/32) overflows to inf, and cos(0 * inf) = NaN poisoned every logit.
    std::vector<uint8_t> b = fixture("tiny");
    put_le(b, 116, 4, 1);
    const std::string msg = load_error(b, NEEDLE_E_FORMAT);
    CHECK(msg.find("rope_theta") != std::string::npos);
    // A small but harmless theta still loads and runs.
    put_le(b, 116, 4, 0x3F000000ull);  // 0.5
    needle_model *m = nullptr;
    REQUIRE(needle_model_load_memory(b.data(), b.size(), nullptr, &m) == NEEDLE_OK);
    CHECK(exercise(m, true) == "");
    needle_model_free(m);
}
