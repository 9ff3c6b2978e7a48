// Writer of .cact v2 containers with seeded random weights (container-v2.md §1-§9; CQ encoding
// per cq-kernels.md §3-§4). The output is meant to pass every check of container-v2.md §12,
// including the SHOULDs (exact placement, zero gaps, no trailing bytes, unused slots zero).
//
// Determinism: the bytes depend only on (geometry, seed). All randomness comes from our own
// splitmix64 stream and Box-Muller (std:: distributions are implementation-defined).
#include "cact_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/f16.h"

namespace needle::writer {
namespace {

// ---------------------------------------------------------------------------------------------
// Constants of the format

constexpr uint32_t kTag = 0x05E12A83u;   // §2 word 0
constexpr size_t kHeaderBytes = 120;     // 29 x u32 + 1 x f32
constexpr uint32_t kCodebookLen = 28;    // §3: 2-, 3- and 4-bit books
constexpr size_t kRecordBytes = 44;      // §4
constexpr uint8_t kFP16 = 1, kCQ = 3, kRAW = 4;
constexpr uint32_t kTernary = 5;         // record bits value of the 1.58-bit width (§7.3)
constexpr uint32_t kTokenizerFixedPieces = 270;  // 4 specials + 10 markers + 256 bytes

// Codebooks (container-v2.md §3, cq-kernels.md §2.2). The spec's table prints the unit levels
// c_b with 7 decimals, which is too coarse to reproduce the stored G = 128 values bit for bit
// (several come out 1 ulp off). So we keep the exact G = 128 f32 bit patterns of the table (the
// fixture exports carry exactly these) and recover c_b = stored128 * sqrt(128) in double; then
// f32(c_b / sqrt(G)) reproduces the table for G = 128 and is the upstream formula for any G.
constexpr uint32_t kBook128[kCodebookLen] = {
    0xbe085e47, 0xbd237060, 0x3d23fc09, 0x3e08a9db,                          // 2-bit
    0xbe41cdbb, 0xbdf16db0, 0xbd87797d, 0xbcac246c,                          // 3-bit
    0x3cb50d39, 0x3d88c69c, 0x3df23363, 0x3e4261c1,                          //
    0xbe7547c2, 0xbe390b02, 0xbe105747, 0xbddf41f9, 0xbda6f045, 0xbd67898a,  // 4-bit
    0xbd06eb34, 0xbc25be0a, 0x3c5040f6, 0x3d124277, 0x3d738a80, 0x3dae086f,  //
    0x3de6e514, 0x3e142b6e, 0x3e3ca926, 0x3e781699};
constexpr double kTernaryUnit = 1.2240064;  // §7.3 / cq-kernels.md §2.1

// Probe heads (§8): manifest codes and sizes. The contrastive width is ours (needle2 uses 128;
// 32 keeps generated files small and exercises the "out from the proj shape" rule).
constexpr uint32_t kContrastiveProbes = 4, kContrastiveOut = 32;
constexpr uint32_t kConfidenceProbes = 8, kConfidenceOut = 1;

// The ten chat markers in id order 4..13 (tokenizer-and-prompt.md §1).
const char *const kChatMarkers[10] = {"<|im_start|>", "<|im_end|>",  "<think>",     "</think>",
                                      "<tools>",      "</tools>",    "<tool_call>", "</tool_call>",
                                      "<tool_result>", "</tool_result>"};
const std::string kMetaSpace = "\xE2\x96\x81";  // U+2581, stands for a space

uint64_t align64(uint64_t x) { return (x + 63) & ~uint64_t(63); }
bool is_pow2(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

// hada_n = D rounded up to a power of two (§2 word 12; D = 1 gives 1).
uint32_t next_pow2(uint32_t d) {
    uint32_t p = 1;
    while (p < d) p <<= 1;
    return p;
}

// ---------------------------------------------------------------------------------------------
// Randomness: splitmix64 + Box-Muller, all arithmetic ours so every platform agrees (up to libm
// ulps in log/cos, which only perturb weights, never the layout).

uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    // Uniform in the open interval (0, 1): 53 random bits, centred in their cell.
    double uniform() { return (double(splitmix64(state_) >> 11) + 0.5) * 0x1.0p-53; }
    double gauss() {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        const double r = std::sqrt(-2.0 * std::log(uniform()));
        const double t = 6.283185307179586 * uniform();
        spare_ = r * std::sin(t);
        have_spare_ = true;
        return r * std::cos(t);
    }

private:
    uint64_t state_;
    double spare_ = 0;
    bool have_spare_ = false;
};

// One independent stream per tensor so a tensor's values depend on (seed, index) only.
Rng tensor_rng(uint64_t seed, uint32_t index) {
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t(index) + 1));
    return Rng(splitmix64(s));
}

// ---------------------------------------------------------------------------------------------
// Little-endian byte output

void put_u16(std::vector<uint8_t> &v, uint16_t x) {
    v.push_back(uint8_t(x));
    v.push_back(uint8_t(x >> 8));
}
void put_u32(std::vector<uint8_t> &v, uint32_t x) {
    for (int i = 0; i < 4; ++i) v.push_back(uint8_t(x >> (8 * i)));
}
void put_u64(std::vector<uint8_t> &v, uint64_t x) {
    for (int i = 0; i < 8; ++i) v.push_back(uint8_t(x >> (8 * i)));
}
void put_f32(std::vector<uint8_t> &v, float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    put_u32(v, bits);
}

// ---------------------------------------------------------------------------------------------
// Tensors before layout

struct Tensor {
    uint8_t dtype = kFP16;
    std::vector<uint32_t> shape;  // ndim = shape.size() (0 for RAW)
    uint32_t group = 0, bits = 0;
    std::vector<uint8_t> data;
};

Tensor fp16_tensor(std::vector<uint32_t> shape, const std::vector<float> &values) {
    Tensor t;
    t.dtype = kFP16;
    t.shape = std::move(shape);
    t.data.reserve(values.size() * 2);
    for (float v : values) put_u16(t.data, f32_to_f16(v));
    return t;
}

// `count` samples of mean + std * N(0,1) from a tensor's own stream (taken by value).
std::vector<float> gaussian(Rng rng, size_t count, double mean, double std) {
    std::vector<float> v(count);
    for (float &x : v) x = float(mean + std * rng.gauss());
    return v;
}

// `count` samples uniform in [lo, hi).
std::vector<float> uniform(Rng rng, size_t count, double lo, double hi) {
    std::vector<float> v(count);
    for (float &x : v) x = float(lo + (hi - lo) * rng.uniform());
    return v;
}

// ---------------------------------------------------------------------------------------------
// CQ encoding (cq-kernels.md §3) and packing (container-v2.md §7)

// Stored levels of one width for group size G: f32(unit / sqrt(G)) computed in double (§2.1).
std::vector<float> cq_levels(uint32_t bits, uint32_t group) {
    const double s = std::sqrt(double(group));
    std::vector<double> unit;
    if (bits == kTernary) {
        unit = {-kTernaryUnit, 0.0, kTernaryUnit};
    } else {
        const uint32_t first = bits == 2 ? 0 : bits == 3 ? 4 : 12, count = 1u << bits;
        for (uint32_t i = first; i < first + count; ++i) {
            float f;
            std::memcpy(&f, &kBook128[i], sizeof f);
            unit.push_back(double(f) * std::sqrt(128.0));
        }
    }
    std::vector<float> levels;
    for (double u : unit) levels.push_back(float(u / s));
    return levels;
}

// In-place normalised Walsh-Hadamard transform, Sylvester order (cq-kernels.md §4).
void fwht(float *x, uint32_t m) {
    for (uint32_t h = 1; h < m; h <<= 1)
        for (uint32_t i = 0; i < m; i += 2 * h)
            for (uint32_t j = i; j < i + h; ++j) {
                const float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    const float scale = 1.0f / std::sqrt(float(m));
    for (uint32_t k = 0; k < m; ++k) x[k] *= scale;
}

// Nearest level, ties to the lower index (cq-kernels.md §3 step 4).
uint32_t nearest_level(const std::vector<float> &levels, float v) {
    uint32_t p = 0;
    while (p < levels.size() && levels[p] < v) ++p;  // lower_bound on a tiny sorted array
    if (p < 1) p = 1;
    if (p > levels.size() - 1) p = uint32_t(levels.size() - 1);
    return std::fabs(v - levels[p - 1]) <= std::fabs(v - levels[p]) ? p - 1 : p;
}

// ORs index `value` (width bits) into an LSB-first row bitstream at position k (§7.1).
void pack_index(uint8_t *row, uint32_t k, uint32_t width, uint32_t value) {
    const uint32_t bit = k * width, byte = bit / 8, shift = bit % 8;
    row[byte] = uint8_t(row[byte] | (value << shift));
    if (shift + width > 8) row[byte + 1] = uint8_t(row[byte + 1] | (value >> (8 - shift)));
}

// Quantises row-major W[out][in] into a CQ record of width `bits` (2, 3, 4 or 5 = ternary).
Tensor cq_tensor(uint32_t out, uint32_t in, const std::vector<float> &w, uint32_t group,
                 uint32_t bits) {
    const uint32_t in_pad = (in + group - 1) / group * group, ngroups = in_pad / group;
    const uint32_t width = bits == kTernary ? 2 : bits;
    const size_t row_bytes = size_t(in_pad) * width / 8;
    const std::vector<float> levels = cq_levels(bits, group);
    // Ternary trit 0/1/2 (-c/0/+c) is stored as crumb 3/0/1 so sign extension gives -1/0/+1.
    static const uint32_t kCrumb[3] = {3, 0, 1};

    Tensor t;
    t.dtype = kCQ;
    t.shape = {out, in};
    t.group = group;
    t.bits = bits;
    t.data.assign(size_t(out) * row_bytes + size_t(out) * ngroups * 2, 0);
    uint8_t *norms = t.data.data() + size_t(out) * row_bytes;
    std::vector<float> buf(group);
    for (uint32_t r = 0; r < out; ++r) {
        uint8_t *row = t.data.data() + size_t(r) * row_bytes;
        for (uint32_t g = 0; g < ngroups; ++g) {
            for (uint32_t k = 0; k < group; ++k) {  // zero-pad columns >= in (§7)
                const uint32_t c = g * group + k;
                buf[k] = c < in ? w[size_t(r) * in + c] : 0.0f;
            }
            fwht(buf.data(), group);
            double ss = 0;
            for (float x : buf) ss += double(x) * x;
            const float norm = float(std::sqrt(ss));
            const float inv = 1.0f / std::max(norm, 1e-12f);
            for (uint32_t k = 0; k < group; ++k) {
                uint32_t idx = nearest_level(levels, buf[k] * inv);
                if (bits == kTernary) idx = kCrumb[idx];
                pack_index(row, g * group + k, width, idx);
            }
            const uint16_t h = f32_to_f16(norm);
            const size_t at = (size_t(r) * ngroups + g) * 2;
            norms[at] = uint8_t(h);
            norms[at + 1] = uint8_t(h >> 8);
        }
    }
    return t;
}

// ---------------------------------------------------------------------------------------------
// Geometry checks: everything the loader (§12.1) would reject, refused before writing.

void require(bool ok, const std::string &what) {
    if (!ok) throw std::invalid_argument("cact_writer: " + what);
}

bool valid_bits(uint32_t b) { return b == 2 || b == 3 || b == 4 || b == kTernary; }

void check_geometry(const Geometry &g) {
    require(g.vocab_size >= 1 && g.d_model >= 1 && g.num_layers >= 1 && g.max_seq_len >= 1,
            "vocab_size, d_model, num_layers and max_seq_len must be >= 1");
    require(g.num_heads >= 1 && g.num_kv_heads >= 1 && g.num_heads % g.num_kv_heads == 0,
            "num_heads must be a positive multiple of num_kv_heads");
    require(g.head_dim >= 2 && g.head_dim % 2 == 0, "head_dim must be even and >= 2");
    require(g.mhc_lanes >= 1, "mhc_lanes must be >= 1");
    require(g.kv_bits == 2 || g.kv_bits == 3 || g.kv_bits == 4 || g.kv_bits == 8,
            "kv_bits must be 2, 3, 4 or 8");
    require(std::isfinite(g.rope_theta) && g.rope_theta > 0, "rope_theta must be finite and > 0");
    require(is_pow2(g.group) && g.group >= 8 && g.group <= 4096,
            "group must be a power of two in 8..4096");
    require(valid_bits(g.bits_embedding) && valid_bits(g.bits_mhc) && valid_bits(g.bits_default),
            "bit widths must be 2, 3, 4 or 5 (ternary)");
    require(!g.engram_orders.empty() && g.engram_orders.size() <= 4,
            "engram_orders needs 1..4 entries");
    for (uint32_t o : g.engram_orders) require(o >= 1, "engram orders must be >= 1");
    require(g.engram_sites.size() <= 4, "at most 4 engram sites");
    std::set<uint32_t> seen;
    for (uint32_t s : g.engram_sites) {
        require(s < g.num_layers, "engram site " + std::to_string(s) + " is not a layer index");
        require(seen.insert(s).second, "engram sites must be distinct");
    }
    if (!g.engram_sites.empty())
        require(g.engram_slots >= 1 && g.engram_sub_dim >= 1 && g.engram_heads >= 1 &&
                    g.engram_conv_taps >= 1,
                "engram sites need slots, sub_dim, heads and taps >= 1");
    // Derived dims are u32 shape entries: their products must not wrap (§12.7 spirit).
    const uint64_t n = g.mhc_lanes, T = uint64_t(g.engram_heads) * g.engram_orders.size();
    const uint64_t dims[] = {uint64_t(g.num_heads) * g.head_dim,
                             uint64_t(g.num_layers) * n * n,
                             n * g.d_model,
                             T * g.engram_slots,
                             T * g.engram_sub_dim,
                             uint64_t(kConfidenceProbes) * g.d_model};
    for (uint64_t d : dims) require(d <= UINT32_MAX, "a derived dimension exceeds 2^32-1");
    if (g.with_tokenizer)
        require(g.vocab_size >= kTokenizerFixedPieces,
                "vocab_size " + std::to_string(g.vocab_size) + " < 270 (tokenizer fixed pieces)");
}

// ---------------------------------------------------------------------------------------------
// Tensor generation in canonical order (§5.1). Scales keep a forward pass tame: matrices
// ~N(0, 1/in) so projections preserve magnitude, ZCRMS gammas near 0 (multiplier 1 + gamma).

class Builder {
public:
    Builder(const Geometry &g, uint64_t seed, const GivenWeights *given = nullptr)
        : g_(g), seed_(seed), given_(given) {}

    std::vector<Tensor> build() {
        const uint32_t D = g_.d_model, V = g_.vocab_size;
        // Embedding ~N(0, 1/D): x0 = e*sqrt(D) has unit-scale entries and tied-head logits
        // (E times a unit-RMS hidden state) are ~N(0, 1).
        add_matrix(V, D, 1.0 / std::sqrt(double(D)), g_.bits_embedding);
        for (uint32_t l = 0; l < g_.num_layers; ++l) add_layer();
        add_mhc();
        for (size_t s = 0; s < g_.engram_sites.size(); ++s) add_engram_site();
        // final_norm: gamma ~N(-1, 1), i.e. a multiplier 1 + gamma of random sign and unit RMS.
        // With a tied head, logit[t] = e_t . hf and hf still holds x0 = e_t*sqrt(D) of the input
        // token, so a positive multiplier makes greedy decoding echo its input forever (the
        // upstream synthetic fixtures do so ~95% of the time). A zero-mean multiplier turns the
        // self term into noise of the same size as the other logits (sd ~1): tame and varied.
        add_fp16({D}, gaussian(next(), D, -1.0, 1.0));
        if (g_.with_heads) add_heads();
        if (g_.with_tokenizer) {
            Tensor t;
            t.dtype = kRAW;
            t.data = given_ && !given_->tokenizer.empty() ? given_->tokenizer
                                                          : build_tokenizer_blob(V);
            out_.push_back(std::move(t));
        }
        require(!given_ || given_->tensors.size() == out_.size() - (g_.with_tokenizer ? 1 : 0),
                "given weights hold " + std::to_string(given_ ? given_->tensors.size() : 0) +
                    " tensors, the canon has " +
                    std::to_string(out_.size() - (g_.with_tokenizer ? 1 : 0)));
        return std::move(out_);
    }

private:
    const Geometry &g_;
    uint64_t seed_;
    const GivenWeights *given_;  // trainer's weights replace the random ones (null: random)
    std::vector<Tensor> out_;

    // The trainer's tensor for the next canonical slot, checked against the slot's shape.
    const GivenTensor *given_next(const std::vector<uint32_t> &shape) const {
        if (!given_) return nullptr;
        const size_t i = out_.size();
        require(i < given_->tensors.size(), "given weights end before tensor " + std::to_string(i));
        const GivenTensor &t = given_->tensors[i];
        require(t.shape == shape, "given tensor " + std::to_string(i) + " has the wrong shape");
        size_t count = 1;
        for (uint32_t d : shape) count *= d;
        require(t.values.size() == count, "given tensor " + std::to_string(i) + " has " +
                                              std::to_string(t.values.size()) + " values, not " +
                                              std::to_string(count));
        require(t.bits == 0 || valid_bits(t.bits), "given tensor " + std::to_string(i) +
                                                       ": bits must be 0, 2, 3, 4 or 5");
        return &t;
    }

    Rng next() { return tensor_rng(seed_, uint32_t(out_.size())); }

    void add_fp16(std::vector<uint32_t> shape, const std::vector<float> &v) {
        const GivenTensor *t = given_next(shape);
        out_.push_back(fp16_tensor(std::move(shape), t ? t->values : v));
    }
    void add_matrix(uint32_t rows, uint32_t cols, double std, uint32_t bits) {
        if (const GivenTensor *t = given_next({rows, cols})) {
            out_.push_back(cq_tensor(rows, cols, t->values, g_.group, t->bits ? t->bits : bits));
            return;
        }
        out_.push_back(cq_tensor(rows, cols, gaussian(next(), size_t(rows) * cols, 0.0, std),
                                 g_.group, bits));
    }
    // [out, in] projection with N(0, 1/in) entries.
    void add_proj(uint32_t rows, uint32_t cols, uint32_t bits) {
        add_matrix(rows, cols, 1.0 / std::sqrt(double(cols)), bits);
    }
    void add_gamma(uint32_t n) { add_fp16({n}, gaussian(next(), n, 0.0, 0.1)); }

    // The 14 tensors of one layer, §5.1 slots B(l)+0..13.
    void add_layer() {
        const uint32_t D = g_.d_model, hd = g_.head_dim;
        const uint32_t A = g_.num_heads * hd, Kd = g_.num_kv_heads * hd;
        const uint32_t Nh = next_pow2(D), b = g_.bits_default;
        add_gamma(D);           // norm_in
        add_proj(A, D, b);      // q_proj
        add_proj(Kd, D, b);     // k_proj
        add_proj(Kd, D, b);     // v_proj
        add_gamma(hd);          // q_norm
        add_gamma(hd);          // k_norm
        add_proj(A, D, b);      // gate_proj
        add_proj(D, A, b);      // out_proj
        add_gamma(D);           // post_norm
        add_fp16({1}, gaussian(next(), 1, 0.0, 1.0));  // attn_gate (pre-sigmoid)
        add_gamma(D);           // pre_hada
        for (int k = 0; k < 3; ++k)  // d1, d2, d3: diagonals near 1 keep the MLP unit-gain
            add_fp16({Nh}, gaussian(next(), Nh, 1.0, 0.1));
    }

    // The 9 mHC tensors, §5.1 M+0..8.
    void add_mhc() {
        const uint32_t L = g_.num_layers, n = g_.mhc_lanes, D = g_.d_model, b = g_.bits_mhc;
        for (int k = 0; k < 3; ++k)  // a_pre, a_post, a_res: positive router gains
            add_fp16({L}, uniform(next(), L, 0.1, 1.0));
        add_fp16({L, n}, gaussian(next(), size_t(L) * n, 0.0, 0.1));  // b_pre
        add_fp16({L, n}, gaussian(next(), size_t(L) * n, 0.0, 0.1));  // b_post
        add_fp16({L, n, n}, gaussian(next(), size_t(L) * n * n, 0.0, 0.1));  // b_res
        add_proj(L * n, n * D, b);      // phi_pre
        add_proj(L * n, n * D, b);      // phi_post
        add_proj(L * n * n, n * D, b);  // phi_res
    }

    // The 4 tensors of one engram site, §5.1 Es(s)+0..3.
    void add_engram_site() {
        const uint32_t D = g_.d_model, sub = g_.engram_sub_dim;
        const uint32_t T = g_.engram_heads * uint32_t(g_.engram_orders.size());
        const uint32_t F = T * sub, b = g_.bits_default;
        add_matrix(T * g_.engram_slots, sub, 0.5, b);  // tables
        add_proj(D, F, b);                             // key_proj
        add_proj(D, F, b);                             // value_proj
        const uint32_t taps = g_.engram_conv_taps;
        add_fp16({taps, D}, gaussian(next(), size_t(taps) * D, 0.0, 0.5));  // taps
    }

    // Probe heads, §8: manifest {1, 2}, then probes/proj/bias per head.
    void add_heads() {
        add_fp16({2}, {1.0f, 2.0f});
        add_head(kContrastiveProbes, kContrastiveOut, false);
        add_head(kConfidenceProbes, kConfidenceOut, true);
    }
    void add_head(uint32_t P, uint32_t out, bool has_bias) {
        const uint32_t D = g_.d_model, in = P * D;
        add_fp16({P, D}, gaussian(next(), size_t(P) * D, 0.0, 1.0));
        add_fp16({out, in}, gaussian(next(), size_t(out) * in, 0.0, 1.0 / std::sqrt(double(in))));
        // The contrastive head has no bias upstream; the exporter writes zeros.
        add_fp16({out}, has_bias ? gaussian(next(), out, 0.0, 0.1) : std::vector<float>(out, 0.0f));
    }
};

// ---------------------------------------------------------------------------------------------
// Serialisation: header (§2), codebook (§3), directory (§4), blobs placed per §4.2.

void write_header(std::vector<uint8_t> &f, const Geometry &g, uint32_t num_tensors) {
    uint32_t max_order = 0;
    for (uint32_t o : g.engram_orders) max_order = std::max(max_order, o);
    const uint32_t words[20] = {kTag,
                                num_tensors,
                                kCodebookLen,
                                g.kv_window,
                                g.kv_bits,
                                g.vocab_size,
                                g.d_model,
                                g.num_heads,
                                g.num_kv_heads,
                                g.num_layers,
                                g.head_dim,
                                g.max_seq_len,
                                next_pow2(g.d_model),
                                g.mhc_lanes,
                                g.engram_slots,
                                g.engram_sub_dim,
                                g.engram_heads * uint32_t(g.engram_orders.size()),
                                g.engram_conv_taps,
                                max_order,  // conv dilation == max(orders), §2 word 18
                                uint32_t(g.engram_orders.size())};
    for (uint32_t w : words) put_u32(f, w);
    for (size_t i = 0; i < 4; ++i) put_u32(f, i < g.engram_orders.size() ? g.engram_orders[i] : 0);
    put_u32(f, uint32_t(g.engram_sites.size()));
    for (size_t i = 0; i < 4; ++i) put_u32(f, i < g.engram_sites.size() ? g.engram_sites[i] : 0);
    put_f32(f, g.rope_theta);
}

void write_codebook(std::vector<uint8_t> &f, uint32_t group) {
    for (uint32_t bits : {2u, 3u, 4u})
        for (float v : cq_levels(bits, group)) put_f32(f, v);
}

void write_record(std::vector<uint8_t> &f, const Tensor &t, uint64_t offset) {
    f.push_back(t.dtype);
    f.push_back(uint8_t(t.shape.size()));
    put_u16(f, 0);
    for (size_t i = 0; i < 4; ++i) put_u32(f, i < t.shape.size() ? t.shape[i] : 0);
    put_u64(f, offset);
    put_u64(f, t.data.size());
    put_u32(f, t.group);
    put_u32(f, t.bits);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer blob (container-v2.md §9)

namespace {

// Frequent English words and tool-calling vocabulary, most frequent first. Each becomes a
// chain of pieces "▁w", "▁wo", ... (and, for the JSON words, the bare chain too), every link
// the concatenation of the previous link and one character, so BPE can always build it.
const char *const kWords[] = {
    "the", "of", "and", "to", "a", "in", "is", "you", "that", "it", "he", "was", "for", "on",
    "are", "as", "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one",
    "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can",
    "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will",
    "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her",
    "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write",
    "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water",
    "been", "call", "who", "its", "now", "find", "long", "down", "day", "did", "get", "come",
    "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work", "know",
    "place", "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our",
    "just", "name", "good", "sentence", "man", "think", "say", "great", "where", "help",
    "through", "much", "before", "line", "right", "too", "mean", "old", "any", "same", "tell",
    "boy", "follow", "came", "want", "show", "also", "around", "form", "three", "small", "set",
    "put", "end", "does", "another", "well", "large", "must", "big", "even", "such", "because",
    "turn", "here", "why", "ask", "went", "men", "read", "need", "land", "different", "home",
    "us", "move", "try", "kind", "hand", "picture", "again", "change", "off", "play", "spell",
    "air", "away", "animal", "house", "point", "page", "letter", "mother", "answer", "found",
    "study", "still", "learn", "should", "America", "world", "The", "It", "What", "Please",
    "weather", "today", "tomorrow", "city", "location", "timer", "minutes", "message",
    "email", "send", "search", "query", "tool", "result", "function", "arguments", "true",
    "false", "null", "string", "type", "value", "hello", "thanks", "user", "assistant",
    "system", "reminder", "alarm", "music", "phone", "contact", "open", "create", "delete",
    "update", "list", "calendar", "event", "meeting", "temperature", "units", "celsius",
};
// Words whose bare (no meta-space) chain is also added: they follow a chat marker, a newline
// or a quote in tool-call JSON, e.g. {"name":"get_weather","arguments":{...}}.
const char *const kBareWords[] = {"user", "assistant", "system", "name", "arguments", "type",
                                  "value", "query", "location", "city", "get", "set", "weather",
                                  "timer", "message", "send", "search", "string", "true",
                                  "false", "null", "What", "How", "ing", "ed", "er", "es", "ly",
                                  "tion"};
// Punctuation runs frequent in JSON and prose.
const char *const kSymbolRuns[] = {"{\"", "\":", "\",", "\"}", "}}", "}]", "[{", "\":\"",
                                   "\",\"", "\"},", "...", "),", ").", "()", "__", "--"};

class PieceTable {
public:
    explicit PieceTable(uint32_t vocab) : vocab_(vocab) {}

    bool full() const { return pieces_.size() >= vocab_; }
    size_t size() const { return pieces_.size(); }
    bool has(const std::string &s) const { return surfaces_.count(s) != 0; }

    // Adds a piece unless the table is full or the surface exists. Scores: 0 for the fixed
    // pieces, -id for NORMAL ones (earlier = merged first, tokenizer-and-prompt.md §2 step 5).
    void add(const std::string &surface, uint8_t type) {
        if (full() || has(surface)) return;
        const float score = type == 0 ? -float(pieces_.size()) : 0.0f;
        pieces_.push_back({surface, type, score});
        surfaces_.insert(surface);
    }

    // Adds every prefix of `s` (from two code points up) in order, so each new piece is an
    // existing piece plus one single-character piece. Needs all of s's characters present.
    void add_chain(const std::vector<std::string> &chars) {
        for (const std::string &c : chars)
            if (!has(c)) return;  // a character is missing (small vocab): BPE could not reach it
        std::string prefix = chars.empty() ? "" : chars[0];
        for (size_t k = 1; k < chars.size(); ++k) {
            prefix += chars[k];
            add(prefix, 0);
        }
    }

    std::vector<uint8_t> serialise() const {
        std::vector<uint8_t> b;
        put_u32(b, uint32_t(pieces_.size()));
        put_u32(b, 0);  // pad_id
        put_u32(b, 1);  // eos_id
        put_u32(b, 2);  // bos_id
        put_u32(b, 3);  // unk_id
        b.push_back(1);  // add_dummy_prefix
        b.push_back(1);  // byte_fallback
        put_u16(b, 0);
        for (const Piece &p : pieces_) {
            put_f32(b, p.score);
            b.push_back(p.type);
            put_u16(b, uint16_t(p.surface.size()));
            b.insert(b.end(), p.surface.begin(), p.surface.end());
        }
        return b;
    }

private:
    struct Piece {
        std::string surface;
        uint8_t type;
        float score;
    };
    uint32_t vocab_;
    std::vector<Piece> pieces_;
    std::set<std::string> surfaces_;
};

// Splits an ASCII word into single-character strings, optionally led by the meta-space.
std::vector<std::string> chars_of(const std::string &word, bool meta_prefix) {
    std::vector<std::string> out;
    if (meta_prefix) out.push_back(kMetaSpace);
    for (char c : word) out.push_back(std::string(1, c));
    return out;
}

}  // namespace

std::vector<uint8_t> build_tokenizer_blob(uint32_t vocab_size) {
    if (vocab_size < kTokenizerFixedPieces)
        throw std::invalid_argument("build_tokenizer_blob: vocab_size " +
                                    std::to_string(vocab_size) + " < 270");
    enum : uint8_t { NORMAL = 0, UNKNOWN = 1, CONTROL = 2, USER_DEFINED = 3, BYTE = 4 };
    PieceTable t(vocab_size);
    t.add("<pad>", CONTROL);
    t.add("</s>", CONTROL);
    t.add("<s>", CONTROL);
    t.add("<unk>", UNKNOWN);
    for (const char *m : kChatMarkers) t.add(m, USER_DEFINED);
    for (uint32_t b = 0; b < 256; ++b) {  // <0xNN>, uppercase hex, id 14 + NN
        static const char kHex[] = "0123456789ABCDEF";
        t.add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", BYTE);
    }
    // Single characters: the meta-space, then printable ASCII (space is written as U+2581).
    t.add(kMetaSpace, NORMAL);
    for (char c = '!'; c <= '~'; ++c) t.add(std::string(1, c), NORMAL);
    // Merges, most useful first: the commonest words, then the chat/JSON pieces (so even a
    // 1024-piece vocab tokenises the prompt template compactly), then the remaining words.
    const size_t n_words = sizeof kWords / sizeof kWords[0], n_top = 100;
    for (size_t i = 0; i < n_top; ++i) t.add_chain(chars_of(kWords[i], true));
    for (const char *w : kBareWords) t.add_chain(chars_of(w, false));
    for (const char *s : kSymbolRuns) t.add_chain(chars_of(s, false));
    for (size_t i = n_top; i < n_words; ++i) t.add_chain(chars_of(kWords[i], true));
    // Filler, still reachable: "▁x" for every character, lowercase pairs, "▁"+pairs, then
    // lowercase triples (26^3 = 17,576).
    for (char c = '!'; c <= '~' && !t.full(); ++c) t.add_chain(chars_of(std::string(1, c), true));
    for (char a = 'a'; a <= 'z' && !t.full(); ++a)
        for (char b = 'a'; b <= 'z'; ++b) t.add_chain(chars_of({a, b}, false));
    for (char a = 'a'; a <= 'z' && !t.full(); ++a)
        for (char b = 'a'; b <= 'z'; ++b) t.add_chain(chars_of({a, b}, true));
    for (char a = 'a'; a <= 'z' && !t.full(); ++a)
        for (char b = 'a'; b <= 'z'; ++b)
            for (char c = 'a'; c <= 'z'; ++c) t.add_chain(chars_of({a, b, c}, false));
    // Beyond that (vocab > ~19k): "▁" + triples ("▁ab" + "c"), then quadruples ("abc" + "d").
    for (char a = 'a'; a <= 'z' && !t.full(); ++a)
        for (char b = 'a'; b <= 'z'; ++b)
            for (char c = 'a'; c <= 'z'; ++c) t.add_chain(chars_of({a, b, c}, true));
    for (char a = 'a'; a <= 'z' && !t.full(); ++a)
        for (char b = 'a'; b <= 'z' && !t.full(); ++b)
            for (char c = 'a'; c <= 'z'; ++c)
                for (char d = 'a'; d <= 'z'; ++d) t.add_chain(chars_of({a, b, c, d}, false));
    if (!t.full())
        throw std::invalid_argument("build_tokenizer_blob: vocab_size " +
                                    std::to_string(vocab_size) + " exceeds the built-in pieces");
    return t.serialise();
}

// ---------------------------------------------------------------------------------------------

namespace {

std::vector<uint8_t> serialise(const Geometry &g, const std::vector<Tensor> &tensors);

}  // namespace

std::vector<uint8_t> write_cact_v2(const Geometry &g, uint64_t seed) {
    check_geometry(g);
    return serialise(g, Builder(g, seed).build());
}

std::vector<uint8_t> write_cact_v2(const Geometry &g, const GivenWeights &weights) {
    check_geometry(g);
    require(!g.with_heads, "given weights carry no probe heads (set with_heads = false)");
    return serialise(g, Builder(g, 0, &weights).build());
}

namespace {

std::vector<uint8_t> serialise(const Geometry &g, const std::vector<Tensor> &tensors) {
    const uint32_t n = uint32_t(tensors.size());

    std::vector<uint8_t> f;
    write_header(f, g, n);
    write_codebook(f, g.group);
    // Offsets per §4.2: first blob at align64(dir_end), each next at align64(previous end).
    const uint64_t dir_end = kHeaderBytes + 4ull * kCodebookLen + kRecordBytes * uint64_t(n);
    std::vector<uint64_t> offsets(n);
    uint64_t at = align64(dir_end);
    for (uint32_t i = 0; i < n; ++i) {
        offsets[i] = at;
        at = align64(at + tensors[i].data.size());
    }
    for (uint32_t i = 0; i < n; ++i) write_record(f, tensors[i], offsets[i]);
    for (uint32_t i = 0; i < n; ++i) {
        f.resize(offsets[i], 0);  // zero gap up to the aligned start
        f.insert(f.end(), tensors[i].data.begin(), tensors[i].data.end());
    }
    return f;  // ends exactly at the last blob (no trailing padding)
}

}  // namespace

Geometry preset(const std::string &name) {
    Geometry g;  // defaults are the demo geometry
    if (name == "demo") {
        g.with_heads = false;
        g.with_tokenizer = true;
        return g;
    }
    if (name == "needle2") {  // container-v2.md §10
        g.vocab_size = 8192;
        g.d_model = 512;
        g.num_heads = 8;
        g.num_kv_heads = 4;
        g.head_dim = 64;
        g.num_layers = 27;
        g.max_seq_len = 2048;
        g.kv_window = 256;
        g.mhc_lanes = 4;
        g.engram_orders = {2, 3};
        g.engram_heads = 2;
        g.engram_sites = {2, 15};
        g.engram_slots = 8192;
        g.engram_sub_dim = 128;
        g.rope_theta = 100000.0f;
        g.with_heads = true;
        return g;
    }
    if (name == "tiny-edge") {  // smallest shapes: one of everything, no engram sites
        g.vocab_size = 300;
        g.d_model = 24;  // not a power of two: hada_n 32, CQ rows padded to the group
        g.num_heads = 1;
        g.num_kv_heads = 1;
        g.head_dim = 8;
        g.num_layers = 1;
        g.max_seq_len = 64;
        g.kv_window = 16;
        g.mhc_lanes = 1;
        g.engram_orders = {2};
        g.engram_heads = 1;
        g.engram_sites = {};
        g.group = 32;
        return g;
    }
    throw std::invalid_argument("unknown preset '" + name + "' (demo, needle2, tiny-edge)");
}

}  // namespace needle::writer
