// .cact v3 loader (container-v3.md §5). Checks run in the spec's order, each before the value
// it guards is used; all size arithmetic is 64-bit. Stricter than the peer where the peer's
// behaviour is undefined or unsafe: the three §5.5 gaps, duplicate Engram sites, blobs that
// overlap the header or directory, non-finite floats and CQ norms (they would poison logits).
#include "container/cact_v3.h"

#include <cmath>

#include "core/bytes.h"
#include "core/error.h"
#include "core/f16.h"

namespace needle {
namespace {

using ull = unsigned long long;

constexpr float kMaxCodebookLevelV3 = 16.0f;  // see parse_cact_v3
constexpr uint64_t kDirStartV3 = kHeaderBytesV3 + 4ull * kCodebookLen;  // 308

[[noreturn]] void bad(const std::string &msg) { fail(NEEDLE_E_FORMAT, msg); }

uint32_t bitlen(uint32_t x) { return x ? 32 - uint32_t(__builtin_clz(x)) : 0; }

HeaderV3 read_header(const uint8_t *p) {
    uint32_t w[48];
    for (int i = 0; i < 48; ++i) w[i] = read_u32(p + 4 * i);
    HeaderV3 h{};
    h.num_tensors = w[1], h.codebook_len = w[2], h.kv_window = w[3], h.kv_bits = w[4];
    h.vocab_size = w[5], h.out_vocab = w[6], h.d_model = w[7], h.num_heads = w[8];
    h.num_kv_heads = w[9], h.num_layers = w[10], h.qk_head_dim = w[11], h.v_head_dim = w[12];
    h.max_seq_len = w[13], h.hada_n = w[14], h.mhc_lanes = w[15], h.sliding_window = w[16];
    h.global_mask = uint64_t(w[17]) | uint64_t(w[18]) << 32;
    h.qkv_conv_taps = w[19], h.engram_slots = w[20], h.engram_sub_dim = w[21];
    h.num_engram_tables = w[22], h.engram_conv_taps = w[23], h.engram_conv_dilation = w[24];
    h.engram_seed_heads = w[25];
    h.n_orders = w[26] < 4 ? w[26] : 4;
    for (int i = 0; i < 4; ++i) h.orders[i] = w[27 + i];
    h.n_sites = w[31] < 16 ? w[31] : 16;
    for (int i = 0; i < 16; ++i) h.sites[i] = w[32 + i];
    h.rope_theta = read_f32(p + 192);
    return h;
}

struct Bound {
    const char *name;
    uint64_t value, cap;
};

void check_bounds(const Bound *b, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (b[i].value > b[i].cap)
            bad(strf("header field %s is %llu, above the bound %llu", b[i].name, ull(b[i].value),
                     ull(b[i].cap)));
}

// §5.1 rule 3.
void check_header_bounds(const HeaderV3 &h, uint64_t size) {
    const uint64_t d = h.d_model, H = h.num_heads;
    const Bound b[] = {
        {"num_tensors", h.num_tensors, (size - kHeaderBytesV3) / kRecordBytes},
        {"num_layers", h.num_layers, 64},
        {"vocab_size", h.vocab_size, 1u << 20},
        {"out_vocab", h.out_vocab, h.vocab_size},
        {"d_model", d, 1u << 16},
        {"num_heads", H, 1u << 16},
        {"num_kv_heads", h.num_kv_heads, 1u << 16},
        {"qk_head_dim", h.qk_head_dim, 1u << 16},
        {"v_head_dim", h.v_head_dim, 1u << 16},
        {"hada_n", h.hada_n, 1u << 16},
        {"engram_sub_dim", h.engram_sub_dim, 1u << 16},
        {"mhc_lanes", h.mhc_lanes, 64},
        {"num_heads*qk_head_dim", H * h.qk_head_dim, 1u << 16},
        {"num_heads*v_head_dim", H * h.v_head_dim, 1u << 16},
        {"mhc_lanes*d_model", uint64_t(h.mhc_lanes) * d, 1u << 16},
        {"max_seq_len", h.max_seq_len, 1u << 20},
        {"sliding_window", h.sliding_window, 1u << 20},
        {"kv_window", h.kv_window, 1u << 20},
        {"qkv_conv_taps", h.qkv_conv_taps, 64},
        {"engram_conv_taps", h.engram_conv_taps, 64},
        {"engram_conv_dilation", h.engram_conv_dilation, 64},
        {"engram_seed_heads", h.engram_seed_heads, 1u << 10},
        {"num_engram_tables", h.num_engram_tables, 1u << 10},
        {"engram_slots", h.engram_slots, 1u << 24},
        {"num_engram_tables*engram_slots", uint64_t(h.num_engram_tables) * h.engram_slots, 1u << 28},
    };
    check_bounds(b, sizeof b / sizeof b[0]);
    for (uint32_t i = 0; i < h.n_orders; ++i)
        if (h.orders[i] > 16) bad(strf("header field engram_orders[%u] is %u, above the bound 16", i, h.orders[i]));
    for (uint32_t i = 0; i < h.n_sites; ++i)
        if (h.sites[i] >= h.num_layers || h.num_layers == 0)
            bad(strf("header field engram_sites[%u] is %u, not below num_layers %u", i, h.sites[i], h.num_layers));
}

// §5.2 rules 6-8 and the first two §5.5 gaps.
void check_geometry(const HeaderV3 &h) {
    if (h.num_layers < 1) bad("header field num_layers is 0, must be 1..64");
    const Bound pos[] = {{"d_model", h.d_model, 0}, {"mhc_lanes", h.mhc_lanes, 0},
                         {"num_heads", h.num_heads, 0}, {"num_kv_heads", h.num_kv_heads, 0},
                         {"qk_head_dim", h.qk_head_dim, 0}, {"v_head_dim", h.v_head_dim, 0},
                         {"max_seq_len", h.max_seq_len, 0}, {"vocab_size", h.vocab_size, 0},
                         {"engram_slots", h.engram_slots, 0}, {"engram_sub_dim", h.engram_sub_dim, 0},
                         {"n_orders", h.n_orders, 0}};
    for (const Bound &b : pos)
        if (b.value == 0) bad(strf("header field %s is 0, must be >= 1", b.name));
    if (h.num_engram_tables % h.n_orders != 0 || h.num_engram_tables / h.n_orders == 0)
        bad(strf("header: num_engram_tables %u is not a positive multiple of n_orders %u",
                 h.num_engram_tables, h.n_orders));
    const uint32_t heads_e = h.num_engram_tables / h.n_orders;
    if (h.d_model / (h.n_orders * heads_e) != h.engram_sub_dim)
        bad(strf("header: engram_sub_dim %u != d_model %u / (n_orders %u * heads %u)", h.engram_sub_dim,
                 h.d_model, h.n_orders, heads_e));
    if (uint64_t(h.num_engram_tables) * h.engram_sub_dim != h.d_model)  // §5.5, second gap
        bad(strf("header: num_engram_tables %u * engram_sub_dim %u != d_model %u", h.num_engram_tables,
                 h.engram_sub_dim, h.d_model));
    if (h.num_heads % h.num_kv_heads != 0)
        bad(strf("header: num_heads %u is not a multiple of num_kv_heads %u", h.num_heads, h.num_kv_heads));
    if (h.qk_head_dim % 2 != 0) bad(strf("header: qk_head_dim %u is not even", h.qk_head_dim));
    if (h.hada_n < h.d_model || !is_pow2(h.hada_n))
        bad(strf("header: hada_n %u is not a power of two >= d_model %u", h.hada_n, h.d_model));
    if (h.n_sites > 0 && h.engram_conv_dilation == 0 && h.engram_conv_taps > 1)  // §5.5, first gap
        bad(strf("header: engram_conv_dilation 0 with engram_conv_taps %u (no implementation defines it)",
                 h.engram_conv_taps));
    for (uint32_t i = 0; i < h.n_sites; ++i)
        for (uint32_t j = i + 1; j < h.n_sites; ++j)
            if (h.sites[i] == h.sites[j])
                bad(strf("header: engram_sites[%u] and engram_sites[%u] are both layer %u", i, j, h.sites[i]));
    if (!std::isfinite(h.rope_theta) || !(h.rope_theta > 0.0f))
        bad(strf("header: rope_theta %g, must be finite and > 0", double(h.rope_theta)));
    for (uint32_t i = 0; i < h.qk_head_dim / 2; ++i) {
        const float f = 1.0f / std::pow(h.rope_theta, float(2 * i) / float(h.qk_head_dim));
        if (!std::isfinite(f) || !std::isfinite(float(h.max_seq_len - 1) * f))
            bad(strf("header: rope_theta %g gives a non-finite RoPE angle", double(h.rope_theta)));
    }
}

class Parser {
public:
    Parser(const uint8_t *data, uint64_t size, ContainerV3 &c) : data_(data), size_(size), c_(c), h_(c.header) {}
    void directory();  // rule 5
    void canon();      // rules 9-17

private:
    std::string who(uint32_t i) const { return strf("tensor %u (%s)", i, tensor_name_v3(c_.canon, i).c_str()); }
    [[noreturn]] void bad_at(uint32_t i, const std::string &what) const { bad(who(i) + ": " + what); }
    const TensorRecord &rec(uint32_t i) const {
        if (i >= n_) bad(strf("canon needs more tensors than the directory (%u records, needs record %u: %s)",
                              n_, i, tensor_name_v3(c_.canon, i).c_str()));
        return c_.tensors[i];
    }
    void floats(uint32_t i, uint64_t count, bool exact = true) const;
    void cq(uint32_t i, uint64_t out, uint64_t in) const;  // out/in 0 = not checked
    void cq_valid(uint32_t i) const;
    void perm(uint32_t i) const;
    void layer(uint32_t l);
    void heads(uint32_t first, uint32_t raw);
    void confidence(uint32_t b) const;

    const uint8_t *data_;
    uint64_t size_;
    ContainerV3 &c_;
    const HeaderV3 &h_;
    uint32_t n_ = 0;
};

void Parser::directory() {
    n_ = h_.num_tensors;
    const uint64_t dir_end = kDirStartV3 + uint64_t(kRecordBytes) * n_;
    if (dir_end > size_)  // rule 4
        bad(strf("file truncated: %llu bytes, directory of num_tensors %u records needs %llu", ull(size_), n_,
                 ull(dir_end)));
    c_.tensors.reserve(n_);  // bounded by the file size (rule 3)
    for (uint32_t i = 0; i < n_; ++i) {
        uint16_t pad = 0;
        TensorRecord r = read_record(data_ + kDirStartV3 + uint64_t(kRecordBytes) * i, pad);
        if (r.ndim > 4) bad(strf("tensor %u: ndim %u, must be 0..4", i, r.ndim));
        uint64_t end = 0;
        if (__builtin_add_overflow(r.offset, r.nbytes, &end) || end > size_)
            bad(strf("tensor %u spans %llu..+%llu but the file is %llu bytes", i, ull(r.offset), ull(r.nbytes),
                     ull(size_)));
        // Stricter than the peer: a blob never overlaps the header, codebook or directory.
        if (r.nbytes > 0 && r.offset < dir_end)
            bad(strf("tensor %u: offset %llu lies inside the header/directory (ends at %llu)", i, ull(r.offset),
                     ull(dir_end)));
        r.data = data_ + r.offset;
        c_.tensors.push_back(r);
    }
}

// A float vector (FP16 or FP32) of exactly `count` elements (rules 11-12), all finite.
void Parser::floats(uint32_t i, uint64_t count, bool exact) const {
    const TensorRecord &r = rec(i);
    if (r.dtype != DType::F16 && r.dtype != DType::F32)
        bad_at(i, strf("dtype %s (%u), expected FP16 or FP32", dtype_name(uint8_t(r.dtype)), unsigned(r.dtype)));
    const uint64_t es = r.dtype == DType::F16 ? 2 : 4;
    if (r.nbytes % es != 0) bad_at(i, strf("nbytes %llu is not a whole number of %s elements", ull(r.nbytes),
                                           dtype_name(uint8_t(r.dtype))));
    const uint64_t have = r.nbytes / es;
    if (exact ? have != count : have < count)
        bad_at(i, strf("%llu elements, expected %s%llu", ull(have), exact ? "" : "at least ", ull(count)));
    if (r.dtype == DType::F16) {
        const uint64_t k = first_nonfinite_f16(r.data, have);
        if (k < have) bad_at(i, strf("element %llu is %s", ull(k), f16_kind(read_u16(r.data + 2 * k))));
    } else {
        for (uint64_t k = 0; k < have; ++k)
            if (!std::isfinite(read_f32(r.data + 4 * k))) bad_at(i, strf("element %llu is not finite", ull(k)));
    }
}

// Rule 15: a usable CQ record (the loader reads the low byte of bits), norms finite.
void Parser::cq_valid(uint32_t i) const {
    const TensorRecord &r = rec(i);
    if (r.dtype != DType::CQ) bad_at(i, strf("dtype %s (%u), expected CQ", dtype_name(uint8_t(r.dtype)), unsigned(r.dtype)));
    if (r.shape[0] == 0 || r.shape[1] == 0) bad_at(i, strf("CQ shape [%u, %u] has a zero dimension", r.shape[0], r.shape[1]));
    const uint32_t bits = r.bits & 0xffu;
    if (bits < 2 || bits > 5) bad_at(i, strf("CQ bits %u, must be 2, 3, 4 or 5 (ternary)", r.bits));
    if (!is_pow2(r.group) || r.group < 8 || r.group > 1024)
        bad_at(i, strf("CQ group %u is not a power of two multiple of 8 up to 1024", r.group));
    TensorRecord t = r;
    t.bits = bits;
    CqLayout lay{};
    if (!cq_layout(t, lay)) bad_at(i, strf("CQ shape [%u, %u] is too large", r.shape[0], r.shape[1]));
    if (r.nbytes < lay.nbytes)
        bad_at(i, strf("nbytes %llu, CQ [%u, %u] %u-bit group %u needs %llu", ull(r.nbytes), r.shape[0], r.shape[1],
                       bits, r.group, ull(lay.nbytes)));
    const uint64_t nn = lay.nbytes - lay.packed, k = first_nonfinite_f16(r.data + lay.packed, nn / 2);
    if (k < nn / 2)
        bad_at(i, strf("norm of row %llu group %llu is %s", ull(k / lay.ngroups), ull(k % lay.ngroups),
                       f16_kind(read_u16(r.data + lay.packed + 2 * k))));
}

// Rules 10-11, 15: CQ with the given logical shape (0 = that dimension is not checked).
void Parser::cq(uint32_t i, uint64_t out, uint64_t in) const {
    cq_valid(i);
    const TensorRecord &r = c_.tensors[i];
    if ((out && r.shape[0] != out) || (in && r.shape[1] != in))
        bad_at(i, strf("shape [%u, %u] does not match geometry [%llu, %llu]", r.shape[0], r.shape[1],
                       ull(out ? out : r.shape[0]), ull(in ? in : r.shape[1])));
}

// Rule 14: exactly hn integral entries in [0, hn).
void Parser::perm(uint32_t i) const {
    floats(i, h_.hada_n);
    const TensorRecord &r = c_.tensors[i];
    for (uint32_t k = 0; k < h_.hada_n; ++k) {
        const float v = r.dtype == DType::F32 ? read_f32(r.data + 4ull * k) : f16_to_f32(read_u16(r.data + 2ull * k));
        if (!(v >= 0.0f) || !(v < float(h_.hada_n)) || v != std::floor(v))
            bad_at(i, strf("entry %u is %g, not an integer in [0, %u)", k, double(v), h_.hada_n));
    }
}

void Parser::layer(uint32_t l) {
    const CanonV3 &cn = c_.canon;
    const uint64_t d = h_.d_model, dq = h_.qk_head_dim, T = h_.qkv_conv_taps, hn = h_.hada_n;
    const uint64_t qd = uint64_t(h_.num_heads) * dq, kd = uint64_t(h_.num_kv_heads) * dq;
    const uint64_t vd = uint64_t(h_.num_kv_heads) * h_.v_head_dim, od = uint64_t(h_.num_heads) * h_.v_head_dim;
    auto at = [&](uint32_t s) { return cn.at(l, s); };
    floats(at(kV3NormIn), d);
    cq(at(kV3Q), qd, d), cq(at(kV3K), kd, d), cq(at(kV3V), vd, d);
    if (T > 0) floats(at(kV3QTaps), T * qd), floats(at(kV3KTaps), T * kd), floats(at(kV3VTaps), T * vd);
    floats(at(kV3QNorm), dq), floats(at(kV3KNorm), dq);
    cq(at(kV3Gate), od, d), cq(at(kV3Out), d, od);
    floats(at(kV3PostNorm), d), floats(at(kV3AttnGate), 1, false), floats(at(kV3PreHada), d);
    for (uint32_t s : {kV3D1, kV3D2, kV3B2, kV3D3, kV3D4}) floats(at(s), hn);
    for (uint32_t s : {kV3W1a, kV3W2a, kV3W3a}) floats(at(s), uint64_t(c_.ba) * c_.ba);
    for (uint32_t s : {kV3W1b, kV3W2b, kV3W3b}) floats(at(s), uint64_t(c_.bb) * c_.bb);
    const uint32_t r = rec(at(kV3CondV)).shape[1];
    if (r < 1 || r > 1024) bad_at(at(kV3CondV), strf("cond_rank (shape[1]) %u, must be 1..1024", r));
    floats(at(kV3CondV), d * r), floats(at(kV3CondU), uint64_t(r) * hn);
    c_.cond_rank[l] = r;
}

// Rule 16 for the confidence head (code 2) whose records start at b.
void Parser::confidence(uint32_t b) const {
    const uint64_t d = h_.d_model, cells = uint64_t(h_.num_layers) + 1;
    cq(b, 0, d);
    const uint64_t rows = c_.tensors[b].shape[0];
    if (rows % cells != 0) bad_at(b, strf("%llu probe rows are not a multiple of num_layers + 1 = %llu", ull(rows), ull(cells)));
    floats(b + 1, rows);
    cq(b + 2, 0, d);
    const uint64_t Q = c_.tensors[b + 2].shape[0];
    floats(b + 3, Q * rows);
    cq(b + 4, 0, Q * d);
    floats(b + 5, c_.tensors[b + 4].shape[0]);  // §5.5, third gap: bias count = out
}

void Parser::heads(uint32_t man, uint32_t raw) {
    if (man == raw) return;  // no manifest
    floats(man, 0, false);
    const TensorRecord &m = c_.tensors[man];
    const uint64_t nh = float_count(m);
    uint32_t next = man + 1;
    for (uint64_t k = 0; k < nh; ++k) {
        const float code = m.dtype == DType::F32 ? read_f32(m.data + 4 * k) : f16_to_f32(read_u16(m.data + 2 * k));
        if (code != 1.0f && code != 2.0f && code != 3.0f)
            bad_at(man, strf("head %llu code %g, must be 1 (embedding), 2 (confidence) or 3 (router)", ull(k), double(code)));
        const uint32_t need = code == 3.0f ? 7 : 6;
        if (uint64_t(next) + need > raw)
            bad_at(man, strf("head %llu (code %g) needs %u records before the tokenizer (record %u), %u remain",
                             ull(k), double(code), need, raw, raw - next));
        c_.heads.push_back({uint32_t(code), next});
        if (code == 2.0f) {
            confidence(next);
            if (c_.confidence < 0) c_.confidence = int32_t(c_.heads.size() - 1);
        }
        next += need;
    }
    if (next != raw) bad(strf("canon: %u records between the probe heads and the tokenizer (record %u)", raw - next, raw));
}

void Parser::canon() {
    const CanonV3 &cn = c_.canon;
    const uint64_t d = h_.d_model, L = h_.num_layers, n = h_.mhc_lanes;
    if (uint64_t(cn.final_norm()) + 1 > n_)  // rule 9
        bad(strf("canon needs more tensors than the directory: %u records, final_norm is record %u", n_,
                 cn.final_norm()));
    cq(cn.embedding(), h_.vocab_size, d);
    c_.cond_rank.assign(L, 0);
    for (uint32_t l = 0; l < L; ++l) layer(l);
    const uint32_t m = cn.mhc();
    floats(m + 0, L), floats(m + 1, L), floats(m + 2, L);
    floats(m + 3, L * n), floats(m + 4, L * n), floats(m + 5, L * n * n);
    cq(m + 6, L * n, n * d), cq(m + 7, L * n, n * d), cq(m + 8, L * n * n, n * d);  // rule 13
    perm(cn.perm()), perm(cn.perm() + 1);
    for (uint32_t s = 0; s < h_.n_sites; ++s) {
        const uint32_t e = cn.engram(s);
        cq(e, uint64_t(h_.num_engram_tables) * h_.engram_slots, h_.engram_sub_dim);
        cq(e + 1, d, d), cq(e + 2, d, d);
        floats(e + 3, uint64_t(h_.engram_conv_taps) * d);
    }
    floats(cn.final_norm(), d);
    uint32_t raw = cn.final_norm() + 1;
    while (raw < n_ && c_.tensors[raw].dtype != DType::RAW) ++raw;
    if (raw == n_) bad("no RAW tokenizer record after final_norm (a container without one cannot serve text)");
    heads(cn.final_norm() + 1, raw);
    c_.tokenizer = c_.tensors[raw].data;
    c_.tokenizer_bytes = c_.tensors[raw].nbytes;
}

}  // namespace

ContainerV3 parse_cact_v3(const uint8_t *data, size_t size) {
    if (data == nullptr && size != 0) fail(NEEDLE_E_INVALID_ARGUMENT, "container data is NULL");
    if (size < kHeaderBytesV3)  // rule 1
        bad(strf("cact truncated: need at least %llu bytes, got %llu", ull(kHeaderBytesV3), ull(size)));
    if (read_u32(data) != kCactTagV3) bad(strf("not a Needle 3 .cact file (tag 0x%08X)", read_u32(data)));
    ContainerV3 c{};
    c.file_bytes = size;
    c.header = read_header(data);
    const HeaderV3 &h = c.header;
    if (h.codebook_len != kCodebookLen)  // rule 2
        bad(strf("header field codebook_len is %u, expected %u", h.codebook_len, kCodebookLen));
    check_header_bounds(h, size);  // rule 3
    if (size < kDirStartV3)
        bad(strf("cact truncated: %llu bytes, header and codebook need %llu", ull(size), ull(kDirStartV3)));
    check_geometry(h);  // rules 6-8
    const std::string cb = read_codebook_levels(data + kHeaderBytesV3, c.codebook);
    if (!cb.empty()) bad(cb);
    // The v3 books are not fixed (§3.1: a reader uses what is stored), so unlike v2 they cannot be
    // compared with a reference. Bound them instead: Lloyd-Max levels for a unit Gaussian are
    // below 3 in magnitude (below 1 once divided by sqrt(group >= 8)); a finite but huge level
    // (say 3e36) passes the ordering checks, then overflows every CQ dot product to inf and the
    // logits to NaN (found by fuzz_load).
    for (uint32_t i = 0; i < kCodebookLen; ++i)
        if (!(std::fabs(c.codebook[i]) <= kMaxCodebookLevelV3))
            bad(strf("codebook: level %u = %.9g is outside [-%g, %g]", i, double(c.codebook[i]),
                     double(kMaxCodebookLevelV3), double(kMaxCodebookLevelV3)));
    c.canon.layers = h.num_layers, c.canon.sites = h.n_sites, c.canon.taps = h.qkv_conv_taps > 0;
    c.canon.per_layer = 24 + (c.canon.taps ? 3 : 0);
    c.ba = 1u << (bitlen(h.hada_n - 1) / 2);
    c.bb = h.hada_n / c.ba;
    Parser p(data, size, c);
    p.directory();  // rules 4-5
    p.canon();      // rules 9-17 (the tokenizer blob's rule 17 is Tokenizer::parse)
    return c;
}

namespace {
const char *const kV3LayerNames[27] = {
    "norm_in", "q_proj", "k_proj", "v_proj", "q_taps", "k_taps", "v_taps", "q_norm", "k_norm",
    "gate_proj", "out_proj", "post_norm", "attn_gate", "pre_hada", "d1", "d2", "b2", "d3", "d4",
    "w1a", "w1b", "w2a", "w2b", "w3a", "w3b", "cond_v", "cond_u"};
const char *const kV3MhcNames[11] = {"mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post",
                                     "mhc_b_res", "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res", "p1", "p2"};
const char *const kV3EngramNames[4] = {"tables", "key_proj", "value_proj", "taps"};
}  // namespace

std::string tensor_name_v3(const CanonV3 &cn, uint32_t i) {
    if (i == 0) return "embedding";
    if (cn.per_layer == 0) return strf("record %u", i);
    if (i < cn.mhc()) {
        const uint32_t l = (i - 1) / cn.per_layer, s = (i - 1) % cn.per_layer;
        return strf("layer%02u.%s", l, kV3LayerNames[s >= 4 && !cn.taps ? s + 3 : s]);
    }
    if (i < cn.engram(0)) return kV3MhcNames[i - cn.mhc()];
    if (i < cn.final_norm()) {
        const uint32_t k = i - cn.engram(0);
        return strf("engram%u.%s", k / 4, kV3EngramNames[k % 4]);
    }
    if (i == cn.final_norm()) return "final_norm";
    if (i == cn.final_norm() + 1) return "heads.manifest";
    return strf("record %u (head or tokenizer)", i);
}

}  // namespace needle
