// .cact v2 loader (container-v2.md). Every check of §12 runs in the spec's order, each before
// the value it guards is used: sizes are proven against the file before anything is allocated,
// read or indexed with them, and all size arithmetic is 64-bit with explicit overflow checks.
#include "container/cact_v2.h"

#include <cmath>

#include "core/bytes.h"
#include "core/error.h"
#include "core/f16.h"

namespace needle {
namespace {

using ull = unsigned long long;  // for printf

constexpr uint64_t kDirStart = kHeaderBytes + 4ull * kCodebookLen;  // 232 (§1)

[[noreturn]] void bad(const std::string &msg) { fail(NEEDLE_E_FORMAT, msg); }

// Only ever applied to values <= the file size, so it cannot wrap.
uint64_t align64(uint64_t x) { return (x + 63) & ~uint64_t(63); }

uint64_t next_pow2(uint64_t x) {  // §2 hada_n: 1 << bitlength(x - 1); x >= 1
    uint64_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

// ------------------------------------------------------------------ §12.1 header

HeaderV2 read_header(const uint8_t *p) {
    uint32_t w[29];
    for (int i = 0; i < 29; ++i) w[i] = read_u32(p + 4 * i);
    HeaderV2 h{};
    h.tag = w[0], h.num_tensors = w[1], h.codebook_len = w[2], h.kv_window = w[3];
    h.kv_bits = w[4], h.vocab_size = w[5], h.d_model = w[6], h.num_heads = w[7];
    h.num_kv_heads = w[8], h.num_layers = w[9], h.head_dim = w[10], h.max_seq_len = w[11];
    h.hada_n = w[12], h.mhc_lanes = w[13], h.engram_slots = w[14], h.engram_sub_dim = w[15];
    h.num_engram_tables = w[16], h.engram_conv_taps = w[17], h.engram_conv_dilation = w[18];
    h.num_engram_orders = w[19];
    for (int i = 0; i < 4; ++i) h.engram_orders[i] = w[20 + i];
    h.num_engram_sites = w[24];
    for (int i = 0; i < 4; ++i) h.engram_sites[i] = w[25 + i];
    h.rope_theta = read_f32(p + 116);
    return h;
}

// Rules 1-2. The tag first: a file too short to hold it, or whose first four bytes are no known
// tag, is not a container at all (an empty download, an HTML error page), whatever its length;
// only a file that starts with the Needle 2 tag can be a truncated one.
void check_size_and_tag(const uint8_t *data, uint64_t size) {
    if (size < 4) {
        char seen[3 * 4 + 1] = "";
        for (uint64_t i = 0; i < size; ++i) std::snprintf(seen + 3 * i, 4, " %02X", data[i]);
        bad(strf("not a .cact file (%llu byte%s%s%s)", ull(size), plural(size), size ? ":" : "", seen));
    }
    const uint32_t tag = read_u32(data);
    if (tag == kCactTagV2) {
        if (size < kHeaderBytes)
            bad(strf("file truncated: %llu byte%s, header needs %llu", ull(size), plural(size),
                     ull(kHeaderBytes)));
        return;
    }
    if (tag == kCactTagOld)
        fail(NEEDLE_E_UNSUPPORTED, "unsupported old .cact format 0x05E12A82 (geometry-less); "
                                   "re-export with a current package");
    if (tag == kCactTagV3)
        fail(NEEDLE_E_UNSUPPORTED,
             "Needle 3 container (tag 0x05E12A84) is not supported by this build");
    bad(strf("not a .cact file (first bytes %02X %02X %02X %02X, tag 0x%08X)", data[0], data[1], data[2],
             data[3], tag));
}

// Rule 3.
void check_codebook_len(const HeaderV2 &h, uint64_t size) {
    if (h.codebook_len != kCodebookLen)
        bad(strf("header: codebook_len %u, expected %u", h.codebook_len, kCodebookLen));
    if (size < kDirStart)
        bad(strf("file truncated: %llu byte%s, header and codebook need %llu", ull(size), plural(size),
                 ull(kDirStart)));
}

struct NamedValue {
    const char *name;
    uint64_t value;
    uint64_t cap;
};

void check_positive_and_capped(const NamedValue *fields, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (fields[i].value == 0) bad(strf("header: %s is 0, must be >= 1", fields[i].name));
    for (size_t i = 0; i < n; ++i)
        if (fields[i].value > fields[i].cap)
            bad(strf("header: %s %llu exceeds this build's limit %llu", fields[i].name,
                     ull(fields[i].value), ull(fields[i].cap)));
}

// Rule 4. Caps come before any arithmetic on the values; A = H*hd may differ from D (§2).
void check_geometry(const HeaderV2 &h) {
    const NamedValue fields[] = {
        {"vocab_size", h.vocab_size, kMaxVocab},     {"d_model", h.d_model, kMaxDModel},
        {"num_heads", h.num_heads, kMaxHeads},       {"num_kv_heads", h.num_kv_heads, kMaxHeads},
        {"num_layers", h.num_layers, kMaxLayers},    {"head_dim", h.head_dim, kMaxHeadDim},
        {"max_seq_len", h.max_seq_len, kMaxSeqLen},  {"mhc_lanes", h.mhc_lanes, kMaxLanes},
    };
    check_positive_and_capped(fields, sizeof fields / sizeof fields[0]);
    const uint64_t attn = uint64_t(h.num_heads) * h.head_dim;
    if (attn > kMaxAttnWidth)
        bad(strf("header: attention width num_heads*head_dim = %llu exceeds this build's limit %u",
                 ull(attn), kMaxAttnWidth));
    if (h.num_heads % h.num_kv_heads != 0)
        bad(strf("header: num_heads %u is not a multiple of num_kv_heads %u", h.num_heads,
                 h.num_kv_heads));
    if (h.head_dim % 2 != 0)  // RoPE rotates half-splits
        bad(strf("header: head_dim %u is not even", h.head_dim));
    const uint64_t want_hada = next_pow2(h.d_model);
    if (h.hada_n != want_hada)
        bad(strf("header: hada_n %u, expected %llu (next power of two >= d_model %u)", h.hada_n,
                 ull(want_hada), h.d_model));
}

// Rule 5.
void check_engram_orders(const HeaderV2 &h) {
    if (h.num_engram_orders < 1 || h.num_engram_orders > 4)
        bad(strf("header: num_engram_orders %u, must be 1..4", h.num_engram_orders));
    uint32_t max_order = 0;
    for (uint32_t i = 0; i < h.num_engram_orders; ++i) {
        const uint32_t o = h.engram_orders[i];
        if (o == 0) bad(strf("header: engram_orders[%u] is 0, must be >= 1", i));
        if (o > kMaxEngramOrder)
            bad(strf("header: engram_orders[%u] = %u exceeds this build's limit %u", i, o,
                     kMaxEngramOrder));
        if (o > max_order) max_order = o;
    }
    // The decode reference strides the taps by max(orders), so a mismatch means corruption.
    if (h.engram_conv_dilation != max_order)
        bad(strf("header: engram_conv_dilation %u, expected %u (max of engram_orders)",
                 h.engram_conv_dilation, max_order));
}

// Rule 6.
void check_engram_sites(const HeaderV2 &h) {
    const uint32_t S = h.num_engram_sites;
    if (S > 4) bad(strf("header: num_engram_sites %u, must be 0..4", S));
    for (uint32_t i = 0; i < S; ++i)
        if (h.engram_sites[i] >= h.num_layers)
            bad(strf("header: engram_sites[%u] = %u is not below num_layers %u", i,
                     h.engram_sites[i], h.num_layers));
    for (uint32_t i = 0; i < S; ++i)
        for (uint32_t j = i + 1; j < S; ++j)
            if (h.engram_sites[i] == h.engram_sites[j])
                bad(strf("header: engram_sites[%u] and engram_sites[%u] are both layer %u", i, j,
                         h.engram_sites[i]));
}

// Rule 7. The fields are meaningless without sites, so they are only checked with S > 0.
// engram_slots needs no cap: T*slots must equal a u32 shape entry (rule 21).
void check_engram_sizes(const HeaderV2 &h) {
    if (h.num_engram_sites == 0) return;
    const NamedValue fields[] = {
        {"engram_slots", h.engram_slots, UINT32_MAX},
        {"engram_sub_dim", h.engram_sub_dim, kMaxEngramSubDim},
        {"num_engram_tables", h.num_engram_tables, kMaxEngramTables},
        {"engram_conv_taps", h.engram_conv_taps, kMaxEngramTaps},
    };
    check_positive_and_capped(fields, sizeof fields / sizeof fields[0]);
    if (h.num_engram_tables % h.num_engram_orders != 0)
        bad(strf("header: num_engram_tables %u is not a multiple of num_engram_orders %u",
                 h.num_engram_tables, h.num_engram_orders));
}

// Rules 8-10.
void check_attention_fields(const HeaderV2 &h) {
    const uint32_t kb = h.kv_bits;
    if (kb != 2 && kb != 3 && kb != 4 && kb != 8)
        bad(strf("header: kv_bits %u, must be 2, 3, 4 or 8", kb));
    if (!std::isfinite(h.rope_theta) || !(h.rope_theta > 0.0f))
        bad(strf("header: rope_theta %g, must be finite and > 0", double(h.rope_theta)));
    // Rule 10 (SHOULD; every fixture and the exporter write zeros).
    for (uint32_t i = h.num_engram_orders; i < 4; ++i)
        if (h.engram_orders[i] != 0)
            bad(strf("header: unused engram_orders[%u] is %u, must be 0", i, h.engram_orders[i]));
    for (uint32_t i = h.num_engram_sites; i < 4; ++i)
        if (h.engram_sites[i] != 0)
            bad(strf("header: unused engram_sites[%u] is %u, must be 0", i, h.engram_sites[i]));
}

// ------------------------------------------------------------------ §12.2 codebook

// Rule 11. The SHOULD comparison against the reference books needs the group size, which only
// the directory gives: check_codebook_reference() runs after it.
void read_codebook(const uint8_t *p, float *cb) {
    const std::string err = read_codebook_levels(p, cb);
    if (!err.empty()) bad(err);
}

// Rule 11, second sentence (SHOULD): each level times sqrt(G) lies within 1e-4 of the reference
// unit books (cq-kernels.md §2.2). Only meaningful once G is known, so it runs after the
// directory. It also bounds the levels: a finite but huge level (say 3e38) passes the ordering
// checks above, then overflows every CQ dot product to inf and the logits to NaN.
void check_codebook_reference(const float *cb, uint32_t group) {
    static const double kUnit[kCodebookLen] = {
        -1.5066708, -0.4514406, 0.4529475, 1.5099326,                                      // 2-bit
        -2.1412479, -1.3337165, -0.7483983, -0.2377402, 0.2500446, 0.7555868, 1.3379826,  // 3-bit
        2.1476363,
        -2.7099900, -2.0444556, -1.5947570, -1.2333362, -0.9222140, -0.6395374, -0.3726639,  // 4-bit
        -0.1144507, 0.1438063, 0.4039890, 0.6726934, 0.9614053, 1.2755258, 1.6370588, 2.0844264,
        2.7410141};
    const double root = std::sqrt(double(group));
    for (uint32_t i = 0; i < kCodebookLen; ++i) {
        const uint32_t bits = i < 4 ? 2 : i < 12 ? 3 : 4, k = i < 4 ? i : i < 12 ? i - 4 : i - 12;
        const double unit = double(cb[i]) * root;
        if (!(std::fabs(unit - kUnit[i]) <= 1e-4))
            bad(strf("codebook: %u-bit level %u = %.9g is %.7f x 1/sqrt(group %u); the reference unit "
                     "level is %.7f (cq-kernels.md 2.2)", bits, k, double(cb[i]), unit, group, kUnit[i]));
    }
}

// ------------------------------------------------------------------ §12.3 directory

class Parser {
public:
    Parser(const uint8_t *data, uint64_t size, ContainerV2 &c) : data_(data), size_(size), c_(c) {}

    void directory();  // rules 12-18
    void canon();      // rules 19-22
    void payload();    // rules 23-24

private:
    std::string who(uint32_t i) const {
        return strf("tensor %u (%s)", i, tensor_name(c_.canon, i, n_).c_str());
    }
    [[noreturn]] void bad_at(uint32_t i, const std::string &what) const { bad(who(i) + ": " + what); }

    TensorRecord read_record(uint32_t i, uint16_t &pad) const;
    void check_fields(uint32_t i, const TensorRecord &r, uint16_t pad) const;  // rule 14
    void check_placement(uint32_t i, TensorRecord &r);                       // rule 15
    void check_plain(uint32_t i, const TensorRecord &r) const;               // rule 16
    void check_cq(uint32_t i, const TensorRecord &r) const;                  // rule 17
    void check_group(uint32_t i, const TensorRecord &r);                     // rule 18
    void check_gap_zero(uint32_t i, uint64_t from, uint64_t to) const;

    void check_dtypes() const;                 // rule 20
    void check_shapes() const;                 // rule 21
    void check_heads();                        // rule 22
    void check_head(const ProbeHeadRecords &h) const;
    void check_shape(uint32_t i, uint32_t ndim, const uint64_t *dims) const;
    float manifest_code(const TensorRecord &m, uint32_t k) const;

    void scan_ternary(uint32_t i, const TensorRecord &r) const;  // rule 23
    void scan_floats(uint32_t i, const TensorRecord &r) const;   // rule 24
    void scan_norms(uint32_t i, const TensorRecord &r) const;    // rule 24

    const uint8_t *data_;
    uint64_t size_;
    ContainerV2 &c_;
    uint32_t n_ = 0;         // num_tensors
    uint64_t dir_end_ = 0;
    uint64_t prev_end_ = 0;  // end of the previous blob (dir_end_ before the first)
    uint32_t group_index_ = 0;
    uint32_t tok_ = 0, num_heads_ = 0;  // §5 layout after rule 19
};

TensorRecord Parser::read_record(uint32_t i, uint16_t &pad) const {
    return needle::read_record(data_ + kDirStart + uint64_t(kRecordBytes) * i, pad);
}

void Parser::check_fields(uint32_t i, const TensorRecord &r, uint16_t pad) const {
    const uint8_t d = uint8_t(r.dtype);
    if (d < 1 || d > 4)
        bad_at(i, strf("dtype %u is not 1 (FP16), 2 (FP32), 3 (CQ) or 4 (RAW)", d));
    if (r.ndim > 4) bad_at(i, strf("ndim %u, must be 0..4", r.ndim));
    for (uint32_t k = r.ndim; k < 4; ++k)
        if (r.shape[k] != 0)
            bad_at(i, strf("shape[%u] = %u beyond ndim %u, must be 0", k, r.shape[k], r.ndim));
    if (pad != 0) bad_at(i, strf("_pad %u, must be 0", pad));  // SHOULD
}

void Parser::check_gap_zero(uint32_t i, uint64_t from, uint64_t to) const {
    for (uint64_t o = from; o < to; ++o)
        if (data_[o] != 0)
            bad_at(i, strf("padding byte at file offset %llu before the blob is 0x%02X, must be 0",
                           ull(o), data_[o]));
}

void Parser::check_placement(uint32_t i, TensorRecord &r) {
    if (r.offset % 64 != 0) bad_at(i, strf("offset %llu is not a multiple of 64", ull(r.offset)));
    const uint64_t first = align64(dir_end_);
    if (r.offset < first)
        bad_at(i, strf("offset %llu lies inside the header/directory (blobs start at %llu)",
                       ull(r.offset), ull(first)));
    uint64_t end = 0;
    if (__builtin_add_overflow(r.offset, r.nbytes, &end))
        bad_at(i, strf("offset %llu + nbytes %llu overflows 64 bits", ull(r.offset), ull(r.nbytes)));
    if (end > size_)
        bad_at(i, strf("offset %llu + nbytes %llu = %llu runs past the end of the file (%llu byte%s)",
                       ull(r.offset), ull(r.nbytes), ull(end), ull(size_), plural(size_)));
    if (r.offset < prev_end_)
        bad_at(i, strf("offset %llu overlaps the previous blob, which ends at %llu", ull(r.offset),
                       ull(prev_end_)));
    // SHOULD (the exporter is deterministic): next 64-byte boundary, zero-filled gap.
    if (r.offset != align64(prev_end_))
        bad_at(i, strf("offset %llu, expected %llu (the previous region ends at %llu)",
                       ull(r.offset), ull(align64(prev_end_)), ull(prev_end_)));
    check_gap_zero(i, prev_end_, r.offset);
    r.data = data_ + r.offset;
    prev_end_ = end;
}

void Parser::check_plain(uint32_t i, const TensorRecord &r) const {
    const uint8_t d = uint8_t(r.dtype);
    if (r.group != 0 || r.bits != 0)
        bad_at(i, strf("%s record has group %u, bits %u; both must be 0", dtype_name(d), r.group,
                       r.bits));
    if (r.dtype == DType::RAW) {
        if (r.ndim != 0) bad_at(i, strf("RAW record has ndim %u, must be 0", r.ndim));
        return;  // opaque bytes: any length
    }
    uint64_t expect = r.dtype == DType::F16 ? 2 : 4;  // prod of an empty shape is 1
    for (uint32_t k = 0; k < r.ndim; ++k)
        if (__builtin_mul_overflow(expect, uint64_t(r.shape[k]), &expect))
            bad_at(i, strf("%s shape %s is too large", dtype_name(d), shape_str(r).c_str()));
    if (r.nbytes != expect)
        bad_at(i, strf("nbytes %llu, expected %llu (%s %s)", ull(r.nbytes), ull(expect),
                       dtype_name(d), shape_str(r).c_str()));
}

void Parser::check_cq(uint32_t i, const TensorRecord &r) const {
    if (r.ndim != 2) bad_at(i, strf("CQ record has ndim %u, must be 2", r.ndim));
    if (r.shape[0] == 0 || r.shape[1] == 0)
        bad_at(i, strf("CQ shape %s has a zero dimension", shape_str(r).c_str()));
    if (r.bits < 2 || r.bits > 5)
        bad_at(i, strf("CQ bits %u, must be 2, 3, 4 or 5 (ternary)", r.bits));
    // 8 keeps every group byte-aligned at 3 bits (§12.3 rule 17).
    if (!is_pow2(r.group) || r.group < 8 || r.group > 4096)
        bad_at(i, strf("CQ group %u is not a power of two in 8..4096", r.group));
    CqLayout lay{};
    if (!cq_layout(r, lay)) bad_at(i, strf("CQ shape %s is too large", shape_str(r).c_str()));
    if (r.nbytes != lay.nbytes)
        bad_at(i, strf("nbytes %llu, expected %llu (CQ %s, %u-bit, group %u)", ull(r.nbytes),
                       ull(lay.nbytes), shape_str(r).c_str(), r.bits, r.group));
}

void Parser::check_group(uint32_t i, const TensorRecord &r) {
    // The header codebook is scaled for one group size, so all CQ records must share it (§6).
    if (c_.group == 0) {
        c_.group = r.group;
        group_index_ = i;
    } else if (r.group != c_.group) {
        bad_at(i, strf("CQ group %u differs from group %u of %s", r.group, c_.group,
                       who(group_index_).c_str()));
    }
}

void Parser::directory() {
    n_ = c_.header.num_tensors;
    // Rule 12: the whole directory must be inside the file before anything is sized by n_.
    const uint64_t dir_end = kDirStart + uint64_t(kRecordBytes) * n_;  // < 2^38: no wrap
    if (dir_end > size_)
        bad(strf("file truncated: %llu byte%s, directory of num_tensors %u record%s needs %llu",
                 ull(size_), plural(size_), n_, plural(n_), ull(dir_end)));
    // Rule 13.
    const uint32_t canon_min = c_.canon.final_norm() + 1;
    if (n_ < canon_min)
        bad(strf("directory: num_tensors %u is below %u, the count for num_layers %u and "
                 "num_engram_sites %u",
                 n_, canon_min, c_.canon.layers, c_.canon.sites));
    dir_end_ = prev_end_ = dir_end;
    c_.tensors.reserve(n_);  // bounded by the file size (rule 12)
    for (uint32_t i = 0; i < n_; ++i) {
        uint16_t pad = 0;
        TensorRecord r = read_record(i, pad);
        check_fields(i, r, pad);
        check_placement(i, r);
        if (r.dtype == DType::CQ) {
            check_cq(i, r);
            check_group(i, r);
        } else {
            check_plain(i, r);
        }
        c_.tensors.push_back(r);
    }
    if (prev_end_ != size_)  // SHOULD: no trailing bytes
        bad(strf("file has %llu trailing byte%s after the last blob (%s ends at %llu, file is "
                 "%llu bytes)",
                 ull(size_ - prev_end_), plural(size_ - prev_end_), who(n_ - 1).c_str(), ull(prev_end_),
                 ull(size_)));
}

// ------------------------------------------------------------------ §12.4 canon

// Expected dtype class and shape of a slot through final_norm (§5.1).
struct Expect {
    bool cq;
    uint32_t ndim;
    uint64_t dims[4];
};

Expect fp(uint64_t a) { return {false, 1, {a, 0, 0, 0}}; }
Expect fp(uint64_t a, uint64_t b) { return {false, 2, {a, b, 0, 0}}; }
Expect fp(uint64_t a, uint64_t b, uint64_t c) { return {false, 3, {a, b, c, 0}}; }
Expect cq(uint64_t out, uint64_t in) { return {true, 2, {out, in, 0, 0}}; }

Expect expect_layer_slot(const HeaderV2 &h, uint32_t slot) {
    const uint64_t D = h.d_model, A = uint64_t(h.num_heads) * h.head_dim;
    const uint64_t Kd = uint64_t(h.num_kv_heads) * h.head_dim, hd = h.head_dim, Nh = h.hada_n;
    switch (slot) {
        case kQProj: case kGateProj: return cq(A, D);
        case kKProj: case kVProj: return cq(Kd, D);
        case kQNorm: case kKNorm: return fp(hd);
        case kOutProj: return cq(D, A);
        case kAttnGate: return fp(1);
        case kD1: case kD2: case kD3: return fp(Nh);
        default: return fp(D);  // norm_in, post_norm, pre_hada
    }
}

Expect expect_mhc_slot(const HeaderV2 &h, uint32_t slot) {
    const uint64_t L = h.num_layers, n = h.mhc_lanes, D = h.d_model;
    switch (slot) {
        case kAPre: case kAPost: case kARes: return fp(L);
        case kBPre: case kBPost: return fp(L, n);
        case kBRes: return fp(L, n, n);
        case kPhiPre: case kPhiPost: return cq(L * n, n * D);
        default: return cq(L * n * n, n * D);  // phi_res
    }
}

Expect expect_engram_slot(const HeaderV2 &h, uint32_t slot) {
    const uint64_t D = h.d_model, T = h.num_engram_tables, sub = h.engram_sub_dim;
    switch (slot) {
        case kTables: return cq(T * h.engram_slots, sub);  // may exceed u32: then never matches
        case kKeyProj: case kValueProj: return cq(D, T * sub);
        default: return fp(h.engram_conv_taps, D);  // taps
    }
}

Expect expect_slot(const HeaderV2 &h, const CanonV2 &cn, uint32_t i) {
    if (i == cn.embedding()) return cq(h.vocab_size, h.d_model);
    if (i < cn.mhc()) return expect_layer_slot(h, (i - 1) % CanonV2::kPerLayer);
    if (i < cn.engram(0)) return expect_mhc_slot(h, i - cn.mhc());
    if (i < cn.final_norm()) return expect_engram_slot(h, (i - cn.engram(0)) % 4);
    return fp(h.d_model);  // final_norm
}

void Parser::check_dtypes() const {
    const uint32_t fn = c_.canon.final_norm();
    for (uint32_t i = 0; i + tok_ < n_; ++i) {
        const bool want_cq = i <= fn && expect_slot(c_.header, c_.canon, i).cq;  // heads: float
        const DType d = c_.tensors[i].dtype;
        if (want_cq && d != DType::CQ)
            bad_at(i, strf("dtype %s, expected CQ", dtype_name(uint8_t(d))));
        if (!want_cq && d != DType::F16 && d != DType::F32)
            bad_at(i, strf("dtype %s, expected FP16 (or FP32)", dtype_name(uint8_t(d))));
    }
}

void Parser::check_shape(uint32_t i, uint32_t ndim, const uint64_t *dims) const {
    const TensorRecord &r = c_.tensors[i];
    bool same = r.ndim == ndim;
    for (uint32_t k = 0; same && k < ndim; ++k) same = r.shape[k] == dims[k];
    if (!same)
        bad_at(i, strf("shape %s, expected %s", shape_str(r).c_str(), shape_str(dims, ndim).c_str()));
}

// Identity is positional (§5), so this is the only guard against a canon shift.
void Parser::check_shapes() const {
    for (uint32_t i = 0; i <= c_.canon.final_norm(); ++i) {
        const Expect e = expect_slot(c_.header, c_.canon, i);
        check_shape(i, e.ndim, e.dims);
    }
}

float Parser::manifest_code(const TensorRecord &m, uint32_t k) const {
    if (m.dtype == DType::F32) return read_f32(m.data + 4ull * k);
    return f16_to_f32(read_u16(m.data + 2ull * k));
}

void Parser::check_heads() {
    const uint32_t man = c_.canon.final_norm() + 1;
    const TensorRecord &m = c_.tensors[man];
    const uint64_t hh = num_heads_;
    check_shape(man, 1, &hh);
    // All codes first: a head's kind decides which checks its tensors get.
    float prev = 0.0f;
    for (uint32_t k = 0; k < num_heads_; ++k) {
        const float code = manifest_code(m, k);  // in bounds: nbytes == 2*Hh (or 4*Hh), rule 16
        if (code != 1.0f && code != 2.0f)
            bad_at(man, strf("head %u code %g, must be 1 (contrastive) or 2 (confidence)", k,
                             double(code)));
        if (k > 0 && !(code > prev))
            bad_at(man, strf("head %u code %g follows code %g; codes must be distinct and "
                             "ascending", k, double(code), double(prev)));
        prev = code;
        c_.heads.push_back({ProbeHeadKind(uint32_t(code)), man + 1 + 3 * k, man + 2 + 3 * k,
                            man + 3 + 3 * k});
    }
    for (const ProbeHeadRecords &h : c_.heads) check_head(h);
}

// probes [P, D], proj [out, P*D], bias [out]; P and out are read from the records (§8).
void Parser::check_head(const ProbeHeadRecords &h) const {
    const TensorRecord &probes = c_.tensors[h.probes], &proj = c_.tensors[h.proj];
    const uint64_t D = c_.header.d_model;
    const uint64_t P = probes.ndim == 2 && probes.shape[0] >= 1 ? probes.shape[0] : 1;
    const uint64_t probes_dims[2] = {P, D};
    check_shape(h.probes, 2, probes_dims);
    const uint64_t out = proj.ndim == 2 && proj.shape[0] >= 1 ? proj.shape[0] : 1;
    const uint64_t proj_dims[2] = {out, P * D};  // P < 2^32, D <= 2^16: no wrap
    check_shape(h.proj, 2, proj_dims);
    check_shape(h.bias, 1, &out);
    // The confidence head yields one logit (§8); a wider one would be another model.
    if (h.kind == ProbeHeadKind::Confidence && out != 1)
        bad_at(h.proj, strf("confidence head has %llu outputs, expected 1", ull(out)));
}

void Parser::canon() {
    // Rule 19: the optional trailers are told apart by the last record's dtype and the count.
    tok_ = c_.tensors[n_ - 1].dtype == DType::RAW ? 1 : 0;
    for (uint32_t i = 0; i + 1 < n_; ++i)
        if (c_.tensors[i].dtype == DType::RAW)
            bad_at(i, "RAW record before the last one; only the tokenizer (last) may be RAW");
    const uint32_t canon_min = c_.canon.final_norm() + 1;
    if (n_ - tok_ < canon_min)
        bad(strf("canon: %u record%s including the tokenizer leave %u for the model, which needs "
                 "%u", n_, plural(n_), n_ - tok_, canon_min));
    const uint32_t extra = n_ - tok_ - canon_min;
    if (extra != 0 && (extra < 4 || (extra - 1) % 3 != 0))
        bad(strf("canon: %u record%s between final_norm (tensor %u) and the %s; expected 0 or "
                 "1 + 3*heads",
                 extra, plural(extra), canon_min - 1, tok_ ? "tokenizer" : "end of the directory"));
    num_heads_ = extra == 0 ? 0 : (extra - 1) / 3;
    check_dtypes();  // rule 20
    check_shapes();  // rule 21
    if (num_heads_ > 0) check_heads();  // rule 22
    if (tok_) {
        c_.tokenizer = c_.tensors[n_ - 1].data;
        c_.tokenizer_bytes = c_.tensors[n_ - 1].nbytes;
    }
}

// ------------------------------------------------------------------ §12.5 payload

void Parser::scan_ternary(uint32_t i, const TensorRecord &r) const {
    CqLayout lay{};
    cq_layout(r, lay);  // cannot fail: accepted by rule 17
    for (uint64_t o = 0; o < lay.packed; ++o) {
        const uint8_t b = r.data[o];
        // A crumb is 2 (binary 10) where its high bit is set and its low bit is clear.
        const uint8_t twos = uint8_t(b & 0xAAu & ~(b << 1));
        if (twos == 0) continue;
        const unsigned crumb = unsigned(__builtin_ctz(twos)) / 2;
        const uint64_t row = o / lay.row_bytes, index = (o % lay.row_bytes) * 4 + crumb;
        bad_at(i, strf("ternary crumb value 2 at row %llu, index %llu (byte 0x%02X)", ull(row),
                       ull(index), b));
    }
}

void Parser::scan_floats(uint32_t i, const TensorRecord &r) const {
    if (r.dtype == DType::F16) {
        const uint64_t n = r.nbytes / 2, k = first_nonfinite_f16(r.data, n);
        if (k < n) bad_at(i, strf("element %llu is %s", ull(k), f16_kind(read_u16(r.data + 2 * k))));
        return;
    }
    for (uint64_t k = 0; k < r.nbytes / 4; ++k) {
        const float v = read_f32(r.data + 4 * k);
        if (!std::isfinite(v)) bad_at(i, strf("element %llu is %s", ull(k), std::isnan(v) ? "NaN" : "inf"));
    }
}

// Inf norms come from f16 overflow at export: corruption in practice (rule 24).
void Parser::scan_norms(uint32_t i, const TensorRecord &r) const {
    CqLayout lay{};
    cq_layout(r, lay);
    const uint8_t *norms = r.data + lay.packed;
    const uint64_t n = (lay.nbytes - lay.packed) / 2, k = first_nonfinite_f16(norms, n);
    if (k < n)
        bad_at(i, strf("norm of row %llu group %llu is %s", ull(k / lay.ngroups), ull(k % lay.ngroups),
                       f16_kind(read_u16(norms + 2 * k))));
}

void Parser::payload() {
    for (uint32_t i = 0; i < n_; ++i)  // rule 23
        if (c_.tensors[i].dtype == DType::CQ && c_.tensors[i].bits == 5) scan_ternary(i, c_.tensors[i]);
    for (uint32_t i = 0; i < n_; ++i) {  // rule 24
        const TensorRecord &r = c_.tensors[i];
        if (r.dtype == DType::F16 || r.dtype == DType::F32) scan_floats(i, r);
        if (r.dtype == DType::CQ) scan_norms(i, r);
    }
}

}  // namespace

ContainerV2 parse_cact_v2(const uint8_t *data, size_t size) {
    if (data == nullptr && size != 0) fail(NEEDLE_E_INVALID_ARGUMENT, "container data is NULL");
    ContainerV2 c{};
    c.file_bytes = size;
    check_size_and_tag(data, size);                        // rules 1-2
    c.header = read_header(data);
    check_codebook_len(c.header, size);                    // rule 3
    check_geometry(c.header);                              // rule 4
    check_engram_orders(c.header);                         // rule 5
    check_engram_sites(c.header);                          // rule 6
    check_engram_sizes(c.header);                          // rule 7
    check_attention_fields(c.header);                      // rules 8-10
    read_codebook(data + kHeaderBytes, c.codebook);        // rule 11
    c.canon = CanonV2{c.header.num_layers, c.header.num_engram_sites};
    Parser p(data, size, c);
    p.directory();  // rules 12-18
    if (c.group != 0) check_codebook_reference(c.codebook, c.group);  // rule 11 SHOULD, needs G
    p.canon();      // rules 19-22
    p.payload();    // rules 23-24
    return c;
}

namespace {

const char *const kLayerNames[CanonV2::kPerLayer] = {
    "norm_in", "q_proj",    "k_proj",   "v_proj", "q_norm", "k_norm", "gate_proj",
    "out_proj", "post_norm", "attn_gate", "pre_hada", "d1",    "d2",     "d3"};
const char *const kMhcNames[9] = {"mhc_a_pre",   "mhc_a_post",   "mhc_a_res",
                                  "mhc_b_pre",   "mhc_b_post",   "mhc_b_res",
                                  "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res"};
const char *const kEngramNames[4] = {"tables", "key_proj", "value_proj", "taps"};
const char *const kHeadParts[3] = {"probes", "proj", "bias"};

// Names past final_norm. Valid layouts differ in count mod 3 (§5): with r = records after
// final_norm, r = 1 is the tokenizer, r = 1 + 3*Hh heads, r = 2 + 3*Hh heads + tokenizer.
std::string trailer_name(uint32_t k, uint32_t r) {
    const bool tok = r % 3 == 2 || r == 1;
    const bool heads = r >= 4 && r % 3 != 0;
    if (tok && k == r - 1) return "tokenizer";
    if (!heads) return strf("extra%u", k);
    if (k == 0) return "heads.manifest";
    const uint32_t hh = (r - (tok ? 2 : 1)) / 3, head = (k - 1) / 3;
    // With two heads the exporter's order (contrastive, confidence) is the only valid one;
    // a single head's kind is only known from the manifest values.
    const std::string base = hh == 2 ? (head == 0 ? "contrastive_head" : "confidence_head")
                                     : strf("head%u", head);
    return base + "." + kHeadParts[(k - 1) % 3];
}

}  // namespace

std::string tensor_name(const CanonV2 &canon, uint32_t index, uint32_t num_tensors) {
    if (index >= num_tensors) return strf("record %u", index);
    if (index == canon.embedding()) return "embedding";
    if (index < canon.mhc()) {
        const uint32_t l = (index - 1) / CanonV2::kPerLayer;
        return strf("layer%02u.%s", l, kLayerNames[(index - 1) % CanonV2::kPerLayer]);
    }
    if (index < canon.engram(0)) return kMhcNames[index - canon.mhc()];
    if (index < canon.final_norm()) {
        const uint32_t k = index - canon.engram(0);
        return strf("engram%u.%s", k / 4, kEngramNames[k % 4]);
    }
    if (index == canon.final_norm()) return "final_norm";
    const uint32_t first = canon.final_norm() + 1;
    return trailer_name(index - first, num_tensors - first);
}

}  // namespace needle
