// .cact v2 loader tests: the fixtures against their manifests, then one corruption per §12 rule
// applied to in-memory copies of tiny.cact / odd.cact / ternary.cact (container-v2.md §13).
#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "container/cact_v2.h"
#include "core/bytes.h"
#include "core/error.h"
#include "fixtures.h"

using needle::ContainerV2;
using needle::DType;
using needle::parse_cact_v2;
using needle::ProbeHeadKind;
using needle::TensorRecord;
using Bytes = std::vector<uint8_t>;

namespace {

const std::string kV2Dir = fixtures::v2("");  // honours $NEEDLE_FIXTURES
const char *const kModels[] = {"tiny", "odd", "ternary", "needle2"};

const Bytes &model_bytes(const std::string &name) {
    static std::map<std::string, Bytes> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, fixtures::read_bytes(kV2Dir + "models/" + name + ".cact")).first;
    return it->second;
}

nlohmann::json manifest(const std::string &name) {
    return fixtures::read_json(kV2Dir + "refs/" + name + "/manifest.json");
}

ContainerV2 parse(const Bytes &b) { return parse_cact_v2(b.data(), b.size()); }

// ---- little-endian patching
void put_u16(uint8_t *p, uint16_t v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }
void put_u32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; ++k) p[k] = uint8_t(v >> (8 * k));
}
void put_u64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; ++k) p[k] = uint8_t(v >> (8 * k));
}
void put_f32(uint8_t *p, float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    put_u32(p, v);
}

// Header word w (§2) and directory record i (§4) with its field offsets.
size_t word(int w) { return size_t(4 * w); }
enum HeaderWord {
    kTag = 0, kNumTensors, kCodebookLenW, kKvWindow, kKvBits, kVocab, kDModel, kHeads, kKvHeads,
    kLayers, kHeadDim, kMaxSeq, kHadaN, kLanes, kSlots, kSubDim, kTables, kTaps, kDilation,
    kNumOrders, kOrders, kNumSites = 24, kSites, kRopeTheta = 29
};
size_t rec(uint32_t i) { return 232 + 44 * size_t(i); }
enum RecordField : size_t { fDtype = 0, fNdim = 1, fPad = 2, fShape = 4, fOffset = 20, fNbytes = 28, fGroup = 36, fBits = 40 };

// A copy of a fixture with one patch applied.
template <class F>
Bytes patched(const char *model, F &&patch) {
    Bytes b = model_bytes(model);
    patch(b);
    return b;
}
Bytes with_u32(const char *model, size_t off, uint32_t v) {
    return patched(model, [&](Bytes &b) { put_u32(&b[off], v); });
}
Bytes with_u64(const char *model, size_t off, uint64_t v) {
    return patched(model, [&](Bytes &b) { put_u64(&b[off], v); });
}

// ---- re-laying out a file exactly as the exporter would (§4.2), for canon-level corruptions
// that must not trip the placement checks first.
struct Entry {
    std::array<uint8_t, 44> rec;
    Bytes blob;
};

std::vector<Entry> entries(const Bytes &file) {
    const ContainerV2 c = parse(file);
    std::vector<Entry> out;
    for (uint32_t i = 0; i < c.tensors.size(); ++i) {
        Entry e;
        std::memcpy(e.rec.data(), &file[rec(i)], 44);
        const TensorRecord &t = c.tensors[i];
        e.blob.assign(t.data, t.data + t.nbytes);
        out.push_back(std::move(e));
    }
    return out;
}

Bytes relayout(const Bytes &file, const std::vector<Entry> &es) {
    Bytes out(file.begin(), file.begin() + 232);
    put_u32(&out[word(kNumTensors)], uint32_t(es.size()));
    out.resize(rec(uint32_t(es.size())));
    uint64_t end = out.size();
    for (size_t i = 0; i < es.size(); ++i) {
        const uint64_t offset = (end + 63) & ~uint64_t(63);
        std::memcpy(&out[rec(uint32_t(i))], es[i].rec.data(), 44);
        put_u64(&out[rec(uint32_t(i)) + fOffset], offset);
        put_u64(&out[rec(uint32_t(i)) + fNbytes], es[i].blob.size());
        out.resize(offset);
        out.insert(out.end(), es[i].blob.begin(), es[i].blob.end());
        end = out.size();
    }
    return out;
}

void set_record(Entry &e, uint8_t dtype, std::initializer_list<uint32_t> shape, uint32_t group,
                uint32_t bits) {
    e.rec[fDtype] = dtype;
    e.rec[fNdim] = uint8_t(shape.size());
    for (int k = 0; k < 4; ++k) put_u32(&e.rec[fShape + 4 * k], 0);
    int k = 0;
    for (uint32_t d : shape) put_u32(&e.rec[fShape + 4 * k++], d);
    put_u32(&e.rec[fGroup], group);
    put_u32(&e.rec[fBits], bits);
}

struct Outcome {
    bool threw = false;
    needle_status code = NEEDLE_OK;
    std::string msg;
};

Outcome try_parse(const uint8_t *data, size_t size) {
    Outcome o;
    try {
        parse_cact_v2(data, size);
    } catch (const needle::Error &e) {
        o.threw = true;
        o.code = e.code();
        o.msg = e.what();
    }
    return o;
}
Outcome try_parse(const Bytes &b) { return try_parse(b.data(), b.size()); }

}  // namespace

// The parse must fail with `status` and a message containing every given fragment.
#define EXPECT_REJECT(bytes, status, ...)                                                     \
    do {                                                                                      \
        const Outcome o_ = try_parse(bytes);                                                  \
        INFO("message: \"", o_.msg, "\"");                                                    \
        CHECK(o_.threw);                                                                      \
        CHECK(o_.code == (status));                                                           \
        for (const char *part_ : {__VA_ARGS__})                                               \
            CHECK_MESSAGE(o_.msg.find(part_) != std::string::npos, "expected \"", std::string(part_), "\""); \
    } while (0)

#define EXPECT_FORMAT(bytes, ...) EXPECT_REJECT(bytes, NEEDLE_E_FORMAT, __VA_ARGS__)

// ======================================================================== fixtures

TEST_CASE("container: every fixture's header, codebook and directory equal its manifest") {
    for (const char *name : kModels) {
        CAPTURE(name);
        const Bytes &b = model_bytes(name);
        const nlohmann::json m = manifest(name);
        const ContainerV2 c = parse(b);
        const nlohmann::json &h = m["header"];
        CHECK(c.file_bytes == m["cact_bytes"].get<uint64_t>());
        CHECK(c.header.tag == std::stoul(m["header_tag"].get<std::string>(), nullptr, 16));
        CHECK(c.header.codebook_len == 28);
        const std::pair<const char *, uint32_t> fields[] = {
            {"num_tensors", c.header.num_tensors},
            {"kv_window", c.header.kv_window},
            {"kv_bits", c.header.kv_bits},
            {"vocab_size", c.header.vocab_size},
            {"d_model", c.header.d_model},
            {"num_heads", c.header.num_heads},
            {"num_kv_heads", c.header.num_kv_heads},
            {"num_layers", c.header.num_layers},
            {"head_dim", c.header.head_dim},
            {"max_seq_len", c.header.max_seq_len},
            {"hada_n", c.header.hada_n},
            {"mhc_lanes", c.header.mhc_lanes},
            {"engram_slots", c.header.engram_slots},
            {"engram_sub_dim", c.header.engram_sub_dim},
            {"num_engram_tables", c.header.num_engram_tables},
            {"engram_conv_taps", c.header.engram_conv_taps},
            {"engram_conv_dilation", c.header.engram_conv_dilation},
        };
        for (const auto &f : fields) {
            CAPTURE(f.first);
            CHECK(f.second == h[f.first].get<uint32_t>());
        }
        const auto orders = h["engram_orders"].get<std::vector<uint32_t>>();
        const auto sites = h["engram_layers"].get<std::vector<uint32_t>>();
        REQUIRE(c.header.num_engram_orders == orders.size());
        REQUIRE(c.header.num_engram_sites == sites.size());
        for (size_t k = 0; k < orders.size(); ++k) CHECK(c.header.engram_orders[k] == orders[k]);
        for (size_t k = 0; k < sites.size(); ++k) CHECK(c.header.engram_sites[k] == sites[k]);
        CHECK(c.header.rope_theta == h["rope_theta"].get<float>());
        for (uint32_t k = 0; k < 28; ++k) CHECK(c.codebook[k] == m["codebook"][k].get<float>());
        CHECK(c.group == 128);
        CHECK(c.canon.layers == c.header.num_layers);
        CHECK(c.canon.sites == c.header.num_engram_sites);

        const nlohmann::json &ts = m["tensors"];
        REQUIRE(c.tensors.size() == ts.size());
        const std::map<std::string, DType> dtypes = {
            {"FP16", DType::F16}, {"FP32", DType::F32}, {"CQ", DType::CQ}, {"RAW", DType::RAW}};
        for (uint32_t i = 0; i < c.tensors.size(); ++i) {
            const TensorRecord &t = c.tensors[i];
            const nlohmann::json &e = ts[i];
            CAPTURE(i);
            REQUIRE(e["index"].get<uint32_t>() == i);
            CHECK(needle::tensor_name(c.canon, i, c.header.num_tensors) == e["name"].get<std::string>());
            CHECK(t.dtype == dtypes.at(e["dtype"].get<std::string>()));
            const auto shape = e["shape"].get<std::vector<uint32_t>>();
            REQUIRE(t.ndim == shape.size());
            for (size_t k = 0; k < 4; ++k) CHECK(t.shape[k] == (k < shape.size() ? shape[k] : 0u));
            CHECK(t.offset == e["offset"].get<uint64_t>());
            CHECK(t.nbytes == e["nbytes"].get<uint64_t>());
            CHECK(t.group == e["group"].get<uint32_t>());
            CHECK(t.bits == e["bits"].get<uint32_t>());
            CHECK(t.data == b.data() + t.offset);
        }
    }
}

TEST_CASE("container: probe heads and tokenizer blob are located") {
    for (const char *name : kModels) {
        CAPTURE(name);
        const Bytes &b = model_bytes(name);
        const nlohmann::json m = manifest(name);
        const ContainerV2 c = parse(b);
        const nlohmann::json &ts = m["tensors"];
        auto name_of = [&](uint32_t i) { return ts[i]["name"].get<std::string>(); };
        if (std::string(name) == "odd") {
            CHECK(c.heads.empty());
        } else {
            REQUIRE(c.heads.size() == 2);
            CHECK(c.heads[0].kind == ProbeHeadKind::Contrastive);
            CHECK(c.heads[1].kind == ProbeHeadKind::Confidence);
            CHECK(name_of(c.canon.final_norm() + 1) == "heads.manifest");
            const char *prefix[2] = {"contrastive_head.", "confidence_head."};
            for (int k = 0; k < 2; ++k) {
                CHECK(name_of(c.heads[k].probes) == std::string(prefix[k]) + "probes");
                CHECK(name_of(c.heads[k].proj) == std::string(prefix[k]) + "proj");
                CHECK(name_of(c.heads[k].bias) == std::string(prefix[k]) + "bias");
            }
            CHECK(c.tensors[c.heads[1].proj].shape[0] == 1);  // one confidence logit
        }
        const nlohmann::json &last = ts.back();
        REQUIRE(last["name"] == "tokenizer");
        CHECK(c.tokenizer == b.data() + last["offset"].get<uint64_t>());
        CHECK(c.tokenizer_bytes == last["nbytes"].get<uint64_t>());
        CHECK(needle::read_u32(c.tokenizer) == c.header.vocab_size);  // blob's n_pieces (§9)
    }
}

TEST_CASE("container: tensor_name follows the canon") {
    const needle::CanonV2 n2{27, 2};  // needle2: 405 records, indices from §5.1
    CHECK(needle::tensor_name(n2, 0, 405) == "embedding");
    CHECK(needle::tensor_name(n2, 17, 405) == "layer01.k_proj");
    CHECK(needle::tensor_name(n2, 378, 405) == "layer26.d3");
    CHECK(needle::tensor_name(n2, 379, 405) == "mhc_a_pre");
    CHECK(needle::tensor_name(n2, 387, 405) == "mhc_phi_res");
    CHECK(needle::tensor_name(n2, 388, 405) == "engram0.tables");
    CHECK(needle::tensor_name(n2, 395, 405) == "engram1.taps");
    CHECK(needle::tensor_name(n2, 396, 405) == "final_norm");
    CHECK(needle::tensor_name(n2, 397, 405) == "heads.manifest");
    CHECK(needle::tensor_name(n2, 401, 405) == "confidence_head.probes");
    CHECK(needle::tensor_name(n2, 404, 405) == "tokenizer");
    CHECK(needle::tensor_name(n2, 405, 405) == "record 405");
    // One head (kind unknown from the count alone), with and without the tokenizer.
    CHECK(needle::tensor_name(n2, 398, 401) == "head0.probes");
    CHECK(needle::tensor_name(n2, 400, 401) == "head0.bias");
    CHECK(needle::tensor_name(n2, 401, 402) == "tokenizer");
    CHECK(needle::tensor_name(n2, 397, 398) == "tokenizer");
    CHECK(needle::tensor_name(n2, 398, 400) == "extra1");  // no valid layout has 3 trailers
}

TEST_CASE("container: an unaligned buffer parses the same") {
    const Bytes &b = model_bytes("tiny");
    Bytes shifted(b.size() + 1);
    std::memcpy(shifted.data() + 1, b.data(), b.size());
    const ContainerV2 c = parse_cact_v2(shifted.data() + 1, b.size());
    CHECK(c.tensors.size() == 83);
    CHECK(c.tensors[5].data == shifted.data() + 1 + c.tensors[5].offset);
}

TEST_CASE("container: FP32 is accepted in an FP16 slot (§4.1)") {
    const Bytes &b = model_bytes("tiny");
    std::vector<Entry> es = entries(b);
    Entry &e = es[1];  // layer00.norm_in [128]
    Bytes f32(e.blob.size() * 2, 0);  // values irrelevant; zero is finite
    e.blob = f32;
    e.rec[fDtype] = 2;
    const ContainerV2 c = parse(relayout(b, es));
    CHECK(c.tensors[1].dtype == DType::F32);
    CHECK(c.tensors[1].nbytes == 512);
}

TEST_CASE("container: a container without the tokenizer or heads still loads") {
    for (const char *name : {"tiny", "odd"}) {
        CAPTURE(name);
        std::vector<Entry> es = entries(model_bytes(name));
        es.pop_back();  // tokenizer
        const ContainerV2 c = parse(relayout(model_bytes(name), es));
        CHECK(c.tokenizer == nullptr);
        CHECK(c.tokenizer_bytes == 0);
        CHECK(c.heads.size() == (std::string(name) == "tiny" ? 2u : 0u));
    }
}

TEST_CASE("container: kv_window takes any value") {
    for (uint32_t w : {0u, 1u, 4096u, 0xFFFFFFFFu})
        CHECK(parse(with_u32("odd", word(kKvWindow), w)).header.kv_window == w);
}

// ======================================================================== §12.1 header

TEST_CASE("container: truncated files") {
    const Bytes &b = model_bytes("tiny");
    auto cut = [&](size_t n) { return Bytes(b.begin(), b.begin() + long(n)); };
    const Outcome none = try_parse(nullptr, 0);
    CHECK(none.code == NEEDLE_E_FORMAT);
    CHECK(none.msg == "not a .cact file (0 bytes)");
    // Too short for the tag: not a container at all, with the bytes seen (issue 13: these were
    // "file truncated: N bytes, header needs 120").
    EXPECT_FORMAT(cut(0), "not a .cact file (0 bytes)");
    EXPECT_FORMAT(cut(1), "not a .cact file (1 byte: 83)");
    EXPECT_FORMAT(cut(3), "not a .cact file (3 bytes: 83 2A E1)");
    // The Needle 2 tag, then too short for the header: a truncated container.
    EXPECT_FORMAT(cut(4), "file truncated: 4 bytes, header needs 120");
    EXPECT_FORMAT(cut(119), "file truncated: 119 bytes, header needs 120");
    EXPECT_FORMAT(cut(200), "file truncated: 200 bytes, header and codebook need 232");
    EXPECT_FORMAT(cut(232 + 44 * 10 + 7), "file truncated: 679 bytes",
                  "num_tensors 83 records needs 3884");
    EXPECT_FORMAT(cut(rec(83) + 10), "tensor 0 (embedding)", "runs past the end");  // gap after the directory
    EXPECT_FORMAT(cut(model_bytes("tiny").size() - 1), "tensor 82 (tokenizer)",
                  "offset 480000 + nbytes 11779 = 491779 runs past the end of the file (491778 bytes)");
    const ContainerV2 c = parse(b);
    EXPECT_FORMAT(cut(c.tensors[40].offset), "tensor 40 (layer02.d1)", "runs past the end");
    EXPECT_FORMAT(cut(c.tensors[40].offset + 7), "tensor 40 (layer02.d1)", "runs past the end");
}

TEST_CASE("container: tags") {
    EXPECT_FORMAT(with_u32("tiny", 0, 0xDEADBEEFu), "not a .cact file (first bytes EF BE AD DE, tag 0xDEADBEEF)");
    EXPECT_FORMAT(with_u32("tiny", 0, 0x05E12A85u), "not a .cact file (first bytes 85 2A E1 05, tag 0x05E12A85)");
    // Whatever the length, an unknown tag is not a container (issue 13: a 60-byte HTML page was
    // "file truncated: 60 bytes, header needs 120").
    const std::string html = "<!DOCTYPE html><html><body>404 Not Found</body></html>\n\n\n\n\n\n";
    REQUIRE(html.size() == 60);
    EXPECT_FORMAT(Bytes(html.begin(), html.end()), "not a .cact file (first bytes 3C 21 44 4F, tag 0x4F44213C)");
    const Bytes zeros(4, 0);
    EXPECT_FORMAT(zeros, "not a .cact file (first bytes 00 00 00 00, tag 0x00000000)");
    EXPECT_REJECT(with_u32("tiny", 0, 0x05E12A82u), NEEDLE_E_UNSUPPORTED,
                  "unsupported old .cact format 0x05E12A82 (geometry-less)", "re-export");
    EXPECT_REJECT(with_u32("tiny", 0, 0x05E12A84u), NEEDLE_E_UNSUPPORTED,
                  "Needle 3 container (tag 0x05E12A84) is not supported by this build");
    // Byte-swapped v2 tag (a big-endian writer).
    EXPECT_FORMAT(with_u32("tiny", 0, 0x832AE105u), "not a .cact file (first bytes 05 E1 2A 83, tag 0x832AE105)");
}

TEST_CASE("container: header geometry (rules 3-4)") {
    EXPECT_FORMAT(with_u32("tiny", word(kCodebookLenW), 27), "header: codebook_len 27, expected 28");
    EXPECT_FORMAT(with_u32("tiny", word(kHadaN), 64), "header: hada_n 64, expected 128");
    EXPECT_FORMAT(with_u32("odd", word(kHadaN), 96), "header: hada_n 96, expected 128",
                  "d_model 96");
    EXPECT_FORMAT(with_u32("tiny", word(kKvHeads), 3),
                  "header: num_heads 4 is not a multiple of num_kv_heads 3");
    EXPECT_FORMAT(with_u32("tiny", word(kKvHeads), 8),
                  "header: num_heads 4 is not a multiple of num_kv_heads 8");
    EXPECT_FORMAT(with_u32("tiny", word(kHeadDim), 31), "header: head_dim 31 is not even");
    EXPECT_FORMAT(with_u32("tiny", word(kDModel), 0), "header: d_model is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kKvHeads), 0), "header: num_kv_heads is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kLayers), 0), "header: num_layers is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kMaxSeq), 0), "header: max_seq_len is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kVocab), 70000), "header: vocab_size 70000 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kLayers), 0xFFFFFFFFu), "header: num_layers 4294967295 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kMaxSeq), (1u << 20) + 1), "header: max_seq_len 1048577 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kLanes), 65), "header: mhc_lanes 65 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kHeadDim), 8192), "header: head_dim 8192 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kHeads), 4096), "attention width num_heads*head_dim = 131072");
}

TEST_CASE("container: header engram fields (rules 5-7, 10)") {
    EXPECT_FORMAT(with_u32("tiny", word(kNumOrders), 0), "header: num_engram_orders 0, must be 1..4");
    EXPECT_FORMAT(with_u32("tiny", word(kNumOrders), 5), "header: num_engram_orders 5, must be 1..4");
    EXPECT_FORMAT(with_u32("tiny", word(kOrders) + 4, 0), "header: engram_orders[1] is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kOrders) + 4, 5000), "header: engram_orders[1] = 5000 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kDilation), 2),
                  "header: engram_conv_dilation 2, expected 3 (max of engram_orders)");
    EXPECT_FORMAT(with_u32("tiny", word(kNumSites), 5), "header: num_engram_sites 5, must be 0..4");
    EXPECT_FORMAT(with_u32("tiny", word(kSites) + 4, 4),
                  "header: engram_sites[1] = 4 is not below num_layers 4");
    EXPECT_FORMAT(with_u32("tiny", word(kSites) + 4, 1),
                  "header: engram_sites[0] and engram_sites[1] are both layer 1");
    EXPECT_FORMAT(with_u32("tiny", word(kSlots), 0), "header: engram_slots is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kSubDim), 0), "header: engram_sub_dim is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kTaps), 0), "header: engram_conv_taps is 0");
    EXPECT_FORMAT(with_u32("tiny", word(kTaps), 65), "header: engram_conv_taps 65 exceeds");
    EXPECT_FORMAT(with_u32("tiny", word(kTables), 3),
                  "header: num_engram_tables 3 is not a multiple of num_engram_orders 2");
    // SHOULD (rule 10): unused slots are zero.
    EXPECT_FORMAT(with_u32("tiny", word(kOrders) + 8, 4), "header: unused engram_orders[2] is 4");
    EXPECT_FORMAT(with_u32("tiny", word(kSites) + 12, 1), "header: unused engram_sites[3] is 1");
}

TEST_CASE("container: header kv_bits and rope_theta (rules 8-9)") {
    EXPECT_FORMAT(with_u32("tiny", word(kKvBits), 5), "header: kv_bits 5, must be 2, 3, 4 or 8");
    EXPECT_FORMAT(with_u32("tiny", word(kKvBits), 0), "header: kv_bits 0");
    for (uint32_t kb : {2u, 3u, 4u}) CHECK(parse(with_u32("tiny", word(kKvBits), kb)).header.kv_bits == kb);
    for (float theta : {std::nanf(""), -10000.0f, 0.0f, -0.0f, INFINITY}) {
        CAPTURE(theta);
        const Bytes b = patched("tiny", [&](Bytes &x) { put_f32(&x[word(kRopeTheta)], theta); });
        EXPECT_FORMAT(b, "header: rope_theta", "must be finite and > 0");
    }
}

// ======================================================================== §12.2 codebook

TEST_CASE("container: codebook (rule 11)") {
    auto cb = [](int k) { return size_t(120 + 4 * k); };
    const Bytes swapped = patched("tiny", [&](Bytes &b) {
        std::array<uint8_t, 4> t;
        std::memcpy(t.data(), &b[cb(1)], 4);
        std::memmove(&b[cb(1)], &b[cb(2)], 4);
        std::memcpy(&b[cb(2)], t.data(), 4);
    });
    EXPECT_FORMAT(swapped, "codebook: 2-bit level 2", "is not above level 1");
    const Bytes equal = patched("tiny", [&](Bytes &b) { std::memcpy(&b[cb(5)], &b[cb(4)], 4); });
    EXPECT_FORMAT(equal, "codebook: 3-bit level 1", "is not above level 0");
    const Bytes nan = patched("tiny", [&](Bytes &b) { put_f32(&b[cb(20)], std::nanf("")); });
    EXPECT_FORMAT(nan, "codebook: 4-bit level 8 is not finite");
    const Bytes inf = patched("tiny", [&](Bytes &b) { put_f32(&b[cb(27)], INFINITY); });
    EXPECT_FORMAT(inf, "codebook: 4-bit level 15 is not finite");
}

// ======================================================================== §12.3 directory

TEST_CASE("container: directory count and record fields (rules 12-14)") {
    EXPECT_FORMAT(with_u32("tiny", word(kNumTensors), 0xFFFFFFFFu), "file truncated",
                  "num_tensors 4294967295");
    EXPECT_FORMAT(with_u32("tiny", word(kNumTensors), 0),
                  "directory: num_tensors 0 is below 75, the count for num_layers 4 and "
                  "num_engram_sites 2");
    EXPECT_FORMAT(with_u32("tiny", word(kNumTensors), 74), "num_tensors 74 is below 75");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[rec(7) + fDtype] = 7; }),
                  "tensor 7 (layer00.gate_proj): dtype 7 is not 1 (FP16), 2 (FP32), 3 (CQ) or 4 (RAW)");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[rec(7) + fDtype] = 0; }), "tensor 7", "dtype 0");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[rec(2) + fNdim] = 5; }),
                  "tensor 2 (layer00.q_proj): ndim 5, must be 0..4");
    EXPECT_FORMAT(with_u32("tiny", rec(1) + fShape + 4, 3),
                  "tensor 1 (layer00.norm_in): shape[1] = 3 beyond ndim 1, must be 0");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { put_u16(&b[rec(5) + fPad], 1); }),
                  "tensor 5 (layer00.q_norm): _pad 1, must be 0");
}

TEST_CASE("container: blob placement (rule 15)") {
    const ContainerV2 c = parse(model_bytes("tiny"));
    const uint64_t off2 = c.tensors[2].offset;  // 71744, right after norm_in's 256 bytes
    REQUIRE(off2 == 71744);
    EXPECT_FORMAT(with_u64("tiny", rec(2) + fOffset, off2 + 1),
                  "tensor 2 (layer00.q_proj): offset 71745 is not a multiple of 64");
    EXPECT_FORMAT(with_u64("tiny", rec(0) + fOffset, 0),
                  "tensor 0 (embedding): offset 0 lies inside the header/directory (blobs start at 3904)");
    EXPECT_FORMAT(with_u64("tiny", rec(2) + fOffset, off2 - 64),
                  "tensor 2 (layer00.q_proj): offset 71680 overlaps the previous blob, which ends at 71744");
    EXPECT_FORMAT(with_u64("tiny", rec(2) + fOffset, off2 + 64),
                  "tensor 2 (layer00.q_proj): offset 71808, expected 71744");
    EXPECT_FORMAT(with_u64("tiny", rec(10) + fNbytes, ~uint64_t(0) - 63),
                  "tensor 10 (layer00.attn_gate): offset", "overflows 64 bits");
    EXPECT_FORMAT(with_u64("tiny", rec(10) + fOffset, uint64_t(1) << 63),
                  "tensor 10 (layer00.attn_gate)", "runs past the end of the file");
    // Gap bytes: between the directory and the first blob, and before the tokenizer.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[3890] = 1; }),
                  "tensor 0 (embedding): padding byte at file offset 3890");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[479990] = 0x80; }),
                  "tensor 82 (tokenizer): padding byte at file offset 479990 before the blob is 0x80");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b.push_back(0); }),
                  "file has 1 trailing byte after the last blob (tensor 82 (tokenizer) ends at 491779");
}

TEST_CASE("container: record sizes, CQ fields and the shared group (rules 16-18)") {
    EXPECT_FORMAT(with_u64("tiny", rec(1) + fNbytes, 254),
                  "tensor 1 (layer00.norm_in): nbytes 254, expected 256 (FP16 [128])");
    EXPECT_FORMAT(with_u32("tiny", rec(82) + fGroup, 128),
                  "tensor 82 (tokenizer): RAW record has group 128, bits 0; both must be 0");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      b[rec(82) + fNdim] = 1;
                      put_u32(&b[rec(82) + fShape], 11779);
                  }),
                  "tensor 82 (tokenizer): RAW record has ndim 1, must be 0");
    // A CQ record with a wrong size, width or group.
    EXPECT_FORMAT(with_u64("tiny", rec(3) + fNbytes, 4160),
                  "tensor 3 (layer00.k_proj): nbytes 4160, expected 4224 (CQ [64, 128], 4-bit, group 128)");
    EXPECT_FORMAT(with_u64("odd", rec(17) + fNbytes, 1087), "tensor 17 (layer01.k_proj): nbytes 1087, expected 1088");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fBits, 6),
                  "tensor 2 (layer00.q_proj): CQ bits 6, must be 2, 3, 4 or 5 (ternary)");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fBits, 1), "tensor 2 (layer00.q_proj): CQ bits 1");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fGroup, 96),
                  "tensor 2 (layer00.q_proj): CQ group 96 is not a power of two in 8..4096");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fGroup, 0), "tensor 2 (layer00.q_proj): CQ group 0");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fGroup, 8192), "tensor 2 (layer00.q_proj): CQ group 8192");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fGroup, 4),  "tensor 2 (layer00.q_proj): CQ group 4");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      b[rec(2) + fNdim] = 3;
                      put_u32(&b[rec(2) + fShape + 8], 1);
                  }),
                  "tensor 2 (layer00.q_proj): CQ record has ndim 3, must be 2");
    EXPECT_FORMAT(with_u32("tiny", rec(2) + fShape, 0), "tensor 2 (layer00.q_proj): CQ shape [0, 128] has a zero dimension");
    // Huge shapes: products must not wrap into a plausible nbytes.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      put_u32(&b[rec(1) + fShape], 0xFFFFFFFFu);
                      b[rec(1) + fNdim] = 4;
                      for (int k = 1; k < 4; ++k) put_u32(&b[rec(1) + fShape + 4 * k], 0xFFFFFFFFu);
                  }),
                  "tensor 1 (layer00.norm_in): FP16 shape", "is too large");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      put_u32(&b[rec(2) + fShape], 0xFFFFFFFFu);
                      put_u32(&b[rec(2) + fShape + 4], 0xFFFFFFFFu);
                  }),
                  "tensor 2 (layer00.q_proj): nbytes 8448, expected");
    // Mixed groups: a self-consistent group-64 record among group-128 ones.
    const Bytes &tiny = model_bytes("tiny");
    std::vector<Entry> es = entries(tiny);
    put_u32(&es[3].rec[fGroup], 64);
    es[3].blob.assign(64 * 64 + 64 * 2 * 2, 0);  // [64, 128] at 4-bit, group 64
    EXPECT_FORMAT(relayout(tiny, es),
                  "tensor 3 (layer00.k_proj): CQ group 64 differs from group 128 of tensor 0 (embedding)");
}

// ======================================================================== §12.4 canon

TEST_CASE("container: dropped tensors (canon shift, rules 13 and 19)") {
    // Decrementing num_tensors in place: odd then reads as "no tokenizer", and the directory end
    // moves, so the exporter's exact placement no longer holds.
    EXPECT_FORMAT(with_u32("odd", word(kNumTensors), 61), "tensor 0 (embedding): offset 3008, expected 2944");
    EXPECT_FORMAT(with_u32("tiny", word(kNumTensors), 82), "tensor 0 (embedding): offset 3904, expected 3840");
    // A record dropped from the middle of a cleanly re-laid-out file.
    for (uint32_t drop : {1u, 17u, 60u}) {
        CAPTURE(drop);
        const Bytes &tiny = model_bytes("tiny");
        std::vector<Entry> es = entries(tiny);
        es.erase(es.begin() + drop);
        EXPECT_FORMAT(relayout(tiny, es),
                      "canon: 6 records between final_norm (tensor 74) and the tokenizer; expected 0 or 1 + 3*heads");
    }
    const Bytes &odd = model_bytes("odd");
    std::vector<Entry> es = entries(odd);
    es.erase(es.begin() + 5);
    EXPECT_FORMAT(relayout(odd, es), "canon: 61 records including the tokenizer leave 60 for the model, which needs 61");
    es.pop_back();  // and the tokenizer
    EXPECT_FORMAT(relayout(odd, es), "directory: num_tensors 60 is below 61");
    // A RAW record anywhere but last.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      b[rec(1) + fDtype] = 4;
                      b[rec(1) + fNdim] = 0;
                      put_u32(&b[rec(1) + fShape], 0);
                  }),
                  "tensor 1 (layer00.norm_in): RAW record before the last one");
}

TEST_CASE("container: dtype class per slot (rule 20)") {
    // FP16 written on a q_proj record: caught by its CQ group/bits first...
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) { b[rec(2) + fDtype] = 1; }),
                  "tensor 2 (layer00.q_proj): FP16 record has group 128, bits 4; both must be 0");
    // ...and, made self-consistent (same 8448 bytes as FP16 [4224]), by the slot's class.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      b[rec(2) + fDtype] = 1;
                      b[rec(2) + fNdim] = 1;
                      put_u32(&b[rec(2) + fShape], 4224);
                      put_u32(&b[rec(2) + fShape + 4], 0);
                      put_u32(&b[rec(2) + fGroup], 0);
                      put_u32(&b[rec(2) + fBits], 0);
                  }),
                  "tensor 2 (layer00.q_proj): dtype FP16, expected CQ");
    // A CQ record in an FP16 slot.
    const Bytes &tiny = model_bytes("tiny");
    std::vector<Entry> es = entries(tiny);
    set_record(es[1], 3, {1, 128}, 128, 4);
    es[1].blob.assign(64 + 2, 0);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 1 (layer00.norm_in): dtype CQ, expected FP16 (or FP32)");
    // A CQ record as a probe head tensor.
    es = entries(tiny);
    set_record(es[76], 3, {4, 128}, 128, 4);
    es[76].blob.assign(4 * 64 + 4 * 2, 0);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 76 (contrastive_head.probes): dtype CQ, expected FP16");
}

TEST_CASE("container: shapes per slot (rule 21)") {
    // Same nbytes (4224) as [64, 128] at 4-bit, so only the canon shape check can see it.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      put_u32(&b[rec(3) + fShape], 32);
                      put_u32(&b[rec(3) + fShape + 4], 256);
                  }),
                  "tensor 3 (layer00.k_proj): shape [32, 256], expected [64, 128]");
    // Swapped q_proj / k_proj records (each with its own blob).
    const Bytes &tiny = model_bytes("tiny");
    std::vector<Entry> es = entries(tiny);
    std::swap(es[2], es[3]);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 2 (layer00.q_proj): shape [64, 128], expected [128, 128]");
    // Swapped post_norm [D] / attn_gate [1].
    es = entries(tiny);
    std::swap(es[9], es[10]);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 9 (layer00.post_norm): shape [1], expected [128]");
    // A d1 of the wrong width in the last layer, an mHC matrix, an engram table.
    es = entries(tiny);
    set_record(es[54], 1, {64}, 0, 0);  // layer03.d1, hada_n 128
    es[54].blob.resize(128);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 54 (layer03.d1): shape [64], expected [128]");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {  // mhc_b_res [4, 4, 4] read as [4, 16]
                      b[rec(62) + fNdim] = 2;
                      put_u32(&b[rec(62) + fShape + 4], 16);
                      put_u32(&b[rec(62) + fShape + 8], 0);
                  }),
                  "tensor 62 (mhc_b_res): shape [4, 16], expected [4, 4, 4]");
    // k_proj and v_proj have the same shape [K*hd, D] by construction: swapping them is not
    // detectable by any structural check (and is not a format error).
    es = entries(tiny);
    std::swap(es[3], es[4]);
    CHECK_NOTHROW(parse(relayout(tiny, es)));
}

TEST_CASE("container: probe heads (rule 22)") {
    const ContainerV2 c = parse(model_bytes("tiny"));
    const uint64_t man = c.tensors[75].offset;
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[man], 0x4200); }),  // 3.0
                  "tensor 75 (heads.manifest): head 0 code 3, must be 1 (contrastive) or 2 (confidence)");
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[man + 2], 0x3C01); }),  // 1.000977
                  "tensor 75 (heads.manifest): head 1 code 1.00098");
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) {
                      put_u16(&b[man], 0x4000);
                      put_u16(&b[man + 2], 0x3C00);
                  }),
                  "tensor 75 (heads.manifest): head 1 code 1 follows code 2; codes must be distinct and ascending");
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[man + 2], 0x3C00); }),
                  "head 1 code 1 follows code 1");
    // Shapes with unchanged byte counts.
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      put_u32(&b[rec(76) + fShape], 8);
                      put_u32(&b[rec(76) + fShape + 4], 64);
                  }),
                  "tensor 76 (contrastive_head.probes): shape [8, 64], expected [8, 128]");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      put_u32(&b[rec(77) + fShape], 256);
                      put_u32(&b[rec(77) + fShape + 4], 256);
                  }),
                  "tensor 77 (contrastive_head.proj): shape [256, 256], expected [256, 512]");
    EXPECT_FORMAT(patched("tiny", [](Bytes &b) {
                      b[rec(75) + fNdim] = 2;
                      put_u32(&b[rec(75) + fShape], 1);
                      put_u32(&b[rec(75) + fShape + 4], 2);
                  }),
                  "tensor 75 (heads.manifest): shape [1, 2], expected [2]");
    // A confidence head with two outputs.
    const Bytes &tiny = model_bytes("tiny");
    std::vector<Entry> es = entries(tiny);
    set_record(es[80], 1, {2, 1024}, 0, 0);
    es[80].blob.assign(2 * 1024 * 2, 0);
    set_record(es[81], 1, {2}, 0, 0);
    es[81].blob.assign(4, 0);
    EXPECT_FORMAT(relayout(tiny, es), "tensor 80 (confidence_head.proj): confidence head has 2 outputs, expected 1");
    // A single head (contrastive only) is valid.
    es = entries(tiny);
    es.erase(es.begin() + 79, es.begin() + 82);
    set_record(es[75], 1, {1}, 0, 0);
    es[75].blob.resize(2);
    const ContainerV2 one = parse(relayout(tiny, es));
    REQUIRE(one.heads.size() == 1);
    CHECK(one.heads[0].kind == ProbeHeadKind::Contrastive);
    CHECK(one.heads[0].probes == 76);
    CHECK(one.tokenizer_bytes == 11779);
}

// ======================================================================== §12.5 payload

TEST_CASE("container: ternary crumb 2 (rule 23)") {
    const ContainerV2 c = parse(model_bytes("ternary"));
    REQUIRE(c.tensors[2].bits == 5);  // layer00.q_proj [128, 128]: 32 packed bytes per row
    const uint64_t off = c.tensors[2].offset;
    EXPECT_FORMAT(patched("ternary", [&](Bytes &b) { b[off] = uint8_t((b[off] & ~0x0Cu) | 0x08u); }),
                  "tensor 2 (layer00.q_proj): ternary crumb value 2 at row 0, index 1");
    EXPECT_FORMAT(patched("ternary", [&](Bytes &b) { b[off + 3 * 32 + 5] = 0x20; }),
                  "tensor 2 (layer00.q_proj): ternary crumb value 2 at row 3, index 22 (byte 0x20)");
    // The last ternary tensor's last packed byte.
    uint32_t last = 0;
    for (uint32_t i = 0; i < c.tensors.size(); ++i)
        if (c.tensors[i].dtype == DType::CQ && c.tensors[i].bits == 5) last = i;
    const TensorRecord &t = c.tensors[last];
    const uint64_t rows = t.shape[0], row_bytes = (t.shape[1] + 127) / 128 * 128 / 4;
    const uint64_t at = t.offset + rows * row_bytes - 1;
    const std::string who = "tensor " + std::to_string(last) + " (" +
                            needle::tensor_name(c.canon, last, c.header.num_tensors) + ")";
    EXPECT_FORMAT(patched("ternary", [&](Bytes &b) { b[at] = 0x80; }), who.c_str(), "crumb value 2");
    // 2-bit (non-ternary) tensors may hold index 2: odd is all 2-bit except embedding and mHC.
    REQUIRE(parse(model_bytes("odd")).tensors[2].bits == 2);
    CHECK_NOTHROW(parse(patched("odd", [](Bytes &b) { b[70784] = 0xAA; })));
}

TEST_CASE("container: NaN and inf payloads (rule 24)") {
    const ContainerV2 c = parse(model_bytes("tiny"));
    const uint64_t norm_in = c.tensors[1].offset;
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[norm_in + 10], 0x7E00); }),
                  "tensor 1 (layer00.norm_in): element 5 is NaN");
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[norm_in + 14], 0xFC00); }),
                  "tensor 1 (layer00.norm_in): element 7 is inf");
    const uint64_t bias = c.tensors[81].offset;
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[bias], 0x7C01); }),
                  "tensor 81 (confidence_head.bias): element 0 is NaN");
    // CQ norms follow the packed rows: q_proj [128, 128] 4-bit has 64 bytes per row.
    const uint64_t norms = c.tensors[2].offset + 128 * 64;
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[norms + 6], 0x7C00); }),
                  "tensor 2 (layer00.q_proj): norm of row 3 group 0 is inf");
    // engram0.tables [514, 64] at 4-bit, group 128: 64 packed bytes + one norm per row.
    REQUIRE(c.tensors[66].shape[0] == 514);
    const uint64_t tnorms = c.tensors[66].offset + 514 * 64;
    EXPECT_FORMAT(patched("tiny", [&](Bytes &b) { put_u16(&b[tnorms + 2 * 513], 0xFE00); }),
                  "tensor 66 (engram0.tables): norm of row 513 group 0 is NaN");
    // An FP32 tensor holding NaN.
    std::vector<Entry> es = entries(model_bytes("tiny"));
    es[1].rec[fDtype] = 2;
    es[1].blob.assign(512, 0);
    put_f32(&es[1].blob[4 * 9], std::nanf(""));
    EXPECT_FORMAT(relayout(model_bytes("tiny"), es), "tensor 1 (layer00.norm_in): element 9 is NaN");
}
