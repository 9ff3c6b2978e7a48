// needle-make-model: writes a .cact v2 container with seeded random weights.
//
//   needle-make-model --preset NAME [--seed S] --out FILE [geometry overrides]
//                     [--weights FILE [--tokenizer-blob FILE]]
//
// --weights replaces the random weights with a trainer's (tools/train/export.py), quantised by
// the same writer. Its format, little-endian: "NDLW", u32 version 1, u32 count, then per tensor
// u32 bits (0 = class default), u32 ndim, ndim x u32 shape, prod(shape) x f32 (row-major).
//
// Prints one line "<path> <bytes> bytes <n> tensors". Exit 0 on success, 2 on bad arguments or a
// geometry the format cannot express, 1 when the file cannot be written.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cact_writer.h"

namespace {

using needle::writer::Geometry;

const char kUsage[] =
    "usage: needle-make-model --preset NAME [--seed S] --out FILE [overrides]\n"
    "  presets: demo, needle2, tiny-edge\n"
    "  overrides: --vocab N --d-model N --heads N --kv-heads N --head-dim N --layers N\n"
    "             --max-seq-len N --window N --kv-bits N --lanes N --group N\n"
    "             --bits-embedding B --bits-mhc B --bits-default B   (B: 2,3,4 or 5=ternary)\n"
    "             --sites none|L[,L...] --slots N --sub-dim N --engram-heads N\n"
    "             --orders O[,O...] --taps N\n"
    "             --rope-theta X --with-heads --no-heads --no-tokenizer\n"
    "  trained weights: --weights FILE [--tokenizer-blob FILE]\n";

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

uint64_t parse_u64(const std::string &flag, const std::string &text, uint64_t max) {
    errno = 0;
    char *end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 0);
    if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE || v > max)
        throw UsageError(flag + ": bad number '" + text + "'");
    return v;
}

uint32_t parse_u32(const std::string &flag, const std::string &text) {
    return uint32_t(parse_u64(flag, text, UINT32_MAX));
}

// "none" or a comma-separated list of layer indices.
std::vector<uint32_t> parse_list(const std::string &flag, const std::string &text) {
    std::vector<uint32_t> out;
    if (text == "none") return out;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        out.push_back(parse_u32(flag, text.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

struct Options {
    std::string preset, out, weights, tokenizer_blob;
    uint64_t seed = 1;
    Geometry geometry;
};

// Presets first, then overrides, so flag order does not matter.
Options parse_args(int argc, char **argv) {
    Options o;
    std::vector<std::pair<std::string, std::string>> overrides;
    std::vector<std::string> switches;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--with-heads" || flag == "--no-heads" || flag == "--no-tokenizer") {
            switches.push_back(flag);
            continue;
        }
        if (flag.rfind("--", 0) != 0 || i + 1 >= argc)
            throw UsageError(flag.rfind("--", 0) == 0 ? flag + " needs a value"
                                                      : "unexpected argument '" + flag + "'");
        const std::string value = argv[++i];
        if (flag == "--preset") o.preset = value;
        else if (flag == "--out") o.out = value;
        else if (flag == "--seed") o.seed = parse_u64(flag, value, UINT64_MAX);
        else if (flag == "--weights") o.weights = value;
        else if (flag == "--tokenizer-blob") o.tokenizer_blob = value;
        else overrides.emplace_back(flag, value);
    }
    if (o.preset.empty()) throw UsageError("--preset is required");
    if (o.out.empty()) throw UsageError("--out is required");
    try {
        o.geometry = needle::writer::preset(o.preset);
    } catch (const std::invalid_argument &e) {
        throw UsageError(e.what());
    }
    Geometry &g = o.geometry;
    for (const auto &[flag, v] : overrides) {
        if (flag == "--vocab") g.vocab_size = parse_u32(flag, v);
        else if (flag == "--d-model") g.d_model = parse_u32(flag, v);
        else if (flag == "--heads") g.num_heads = parse_u32(flag, v);
        else if (flag == "--kv-heads") g.num_kv_heads = parse_u32(flag, v);
        else if (flag == "--head-dim") g.head_dim = parse_u32(flag, v);
        else if (flag == "--layers") g.num_layers = parse_u32(flag, v);
        else if (flag == "--max-seq-len") g.max_seq_len = parse_u32(flag, v);
        else if (flag == "--window") g.kv_window = parse_u32(flag, v);
        else if (flag == "--kv-bits") g.kv_bits = parse_u32(flag, v);
        else if (flag == "--lanes") g.mhc_lanes = parse_u32(flag, v);
        else if (flag == "--group") g.group = parse_u32(flag, v);
        else if (flag == "--bits-embedding") g.bits_embedding = parse_u32(flag, v);
        else if (flag == "--bits-mhc") g.bits_mhc = parse_u32(flag, v);
        else if (flag == "--bits-default") g.bits_default = parse_u32(flag, v);
        else if (flag == "--sites") g.engram_sites = parse_list(flag, v);
        else if (flag == "--orders") g.engram_orders = parse_list(flag, v);
        else if (flag == "--taps") g.engram_conv_taps = parse_u32(flag, v);
        else if (flag == "--slots") g.engram_slots = parse_u32(flag, v);
        else if (flag == "--sub-dim") g.engram_sub_dim = parse_u32(flag, v);
        else if (flag == "--engram-heads") g.engram_heads = parse_u32(flag, v);
        else if (flag == "--rope-theta") {
            char *end = nullptr;
            g.rope_theta = std::strtof(v.c_str(), &end);
            if (v.empty() || *end != '\0') throw UsageError(flag + ": bad number '" + v + "'");
        } else throw UsageError("unknown option " + flag);
    }
    for (const std::string &s : switches) {
        if (s == "--with-heads") g.with_heads = true;
        if (s == "--no-heads") g.with_heads = false;
        if (s == "--no-tokenizer") g.with_tokenizer = false;
    }
    return o;
}

bool read_file(const std::string &path, std::vector<uint8_t> &bytes) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    uint8_t buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    const bool ok = !std::ferror(f);
    std::fclose(f);
    return ok;
}

// Cursor over an NDLW file; every read is bounds-checked against the bytes actually read.
class Reader {
public:
    explicit Reader(const std::vector<uint8_t> &b) : b_(b) {}
    uint32_t u32() {
        need(4);
        const uint32_t v = uint32_t(b_[at_]) | uint32_t(b_[at_ + 1]) << 8 |
                           uint32_t(b_[at_ + 2]) << 16 | uint32_t(b_[at_ + 3]) << 24;
        at_ += 4;
        return v;
    }
    void floats(std::vector<float> &out, uint64_t count) {
        if (count > (b_.size() - at_) / 4) throw UsageError("--weights: file truncated");
        out.resize(size_t(count));
        std::memcpy(out.data(), b_.data() + at_, size_t(count) * 4);  // little-endian host
        at_ += size_t(count) * 4;
    }
    bool done() const { return at_ == b_.size(); }

private:
    void need(size_t n) const {
        if (b_.size() - at_ < n) throw UsageError("--weights: file truncated");
    }
    const std::vector<uint8_t> &b_;
    size_t at_ = 0;
};

needle::writer::GivenWeights read_weights(const Options &o) {
    std::vector<uint8_t> bytes;
    if (!read_file(o.weights, bytes)) throw UsageError("cannot read " + o.weights);
    Reader r(bytes);
    if (r.u32() != 0x574C444Eu || r.u32() != 1)  // "NDLW", version 1
        throw UsageError("--weights: not an NDLW version 1 file");
    needle::writer::GivenWeights w;
    const uint32_t count = r.u32();
    if (count > bytes.size() / 8) throw UsageError("--weights: bad tensor count");
    w.tensors.resize(count);
    for (auto &t : w.tensors) {
        t.bits = r.u32();
        const uint32_t ndim = r.u32();
        if (ndim > 4) throw UsageError("--weights: ndim > 4");
        uint64_t n = 1;
        for (uint32_t k = 0; k < ndim; ++k) {
            t.shape.push_back(r.u32());
            n *= t.shape.back();
            if (n > bytes.size()) throw UsageError("--weights: file truncated");
        }
        r.floats(t.values, n);
    }
    if (!r.done()) throw UsageError("--weights: trailing bytes");
    if (!o.tokenizer_blob.empty() && !read_file(o.tokenizer_blob, w.tokenizer))
        throw UsageError("cannot read " + o.tokenizer_blob);
    return w;
}

bool write_file(const std::string &path, const std::vector<uint8_t> &bytes) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    std::vector<uint8_t> bytes;
    try {
        o = parse_args(argc, argv);
        bytes = o.weights.empty() ? needle::writer::write_cact_v2(o.geometry, o.seed)
                                  : needle::writer::write_cact_v2(o.geometry, read_weights(o));
    } catch (const UsageError &e) {
        std::fprintf(stderr, "needle-make-model: %s\n%s", e.what(), kUsage);
        return 2;
    } catch (const std::invalid_argument &e) {  // geometry the format cannot express
        std::fprintf(stderr, "needle-make-model: %s\n", e.what());
        return 2;
    }
    if (!write_file(o.out, bytes)) {
        std::fprintf(stderr, "needle-make-model: cannot write %s: %s\n", o.out.c_str(),
                     std::strerror(errno));
        return 1;
    }
    const uint32_t num_tensors = uint32_t(bytes[4]) | uint32_t(bytes[5]) << 8 |
                                 uint32_t(bytes[6]) << 16 | uint32_t(bytes[7]) << 24;
    std::printf("%s %zu bytes %u tensors\n", o.out.c_str(), bytes.size(), num_tensors);
    return 0;
}
