// Replay of the peer's 1,512 single-field corruptions of tiny3 (fixtures/v3/corruption,
// case scheme of container-v3.md §5): every `err` and the `defect` case is refused with a
// message; an `ok` case either loads and runs a prefill plus 4 decode steps with finite logits,
// or is refused with a message. Reports the counts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "api_util.h"
#include "fixtures.h"
#include "needle.h"

using namespace api_test;

namespace {

uint32_t get32(const std::vector<uint8_t> &b, size_t o) {
    return uint32_t(b[o]) | uint32_t(b[o + 1]) << 8 | uint32_t(b[o + 2]) << 16 | uint32_t(b[o + 3]) << 24;
}
void put(std::vector<uint8_t> &b, size_t o, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b[o + size_t(i)] = uint8_t(v >> (8 * i));
}

// The corrupted file of one case name, or false if the name is not understood.
bool corrupt(const std::vector<uint8_t> &good, const std::string &name, std::vector<uint8_t> &out) {
    out = good;
    std::istringstream in(name);
    std::string w1, w2, w3, eq, val;
    in >> w1;
    if (w1 == "untouched") return true;
    if (w1 == "truncated") {
        in >> w2 >> val;
        out.resize(std::stoull(val));
        return true;
    }
    const size_t dir = 308, n = get32(good, 4);
    const size_t tok = size_t(get32(good, dir + 44 * (n - 1) + 20));  // offset of the last record
    if (w1 == "header") {  // header word W = V
        in >> w2 >> w3 >> eq >> val;
        put(out, 4 * std::stoul(w3), std::stoull(val, nullptr, 16), 4);
        return true;
    }
    if (w1 == "record") {  // record R FIELD = V
        in >> w2 >> w3 >> eq >> val;
        const size_t r = dir + 44 * std::stoul(w2);
        const uint64_t v = std::stoull(val, nullptr, 16);
        if (w3 == "dtype") out[r] = uint8_t(v);
        else if (w3 == "shape0") put(out, r + 4, v, 4);
        else if (w3 == "shape1") put(out, r + 8, v, 4);
        else if (w3 == "offset") put(out, r + 20, v, 8);
        else if (w3 == "nbytes") put(out, r + 28, v, 8);
        else if (w3 == "group") put(out, r + 36, v, 4);
        else if (w3 == "bits") put(out, r + 40, v, 4);
        else return false;
        return true;
    }
    if (w1 == "tokenizer") {
        in >> w2;
        if (w2 == "piece") {  // tokenizer piece 0 len = V
            in >> w3 >> val >> eq >> val;
            put(out, tok + 24 + 5, std::stoull(val, nullptr, 16), 2);
            return true;
        }
        in >> eq >> val;
        const char *fields[] = {"n_pieces", "pad", "eos", "bos", "unk"};
        for (int k = 0; k < 5; ++k)
            if (w2 == fields[k]) {
                put(out, tok + 4 * size_t(k), std::stoull(val, nullptr, 16), 4);
                return true;
            }
    }
    return false;
}

// Loads and runs a prefill plus 4 decode steps; "" or what went wrong.
std::string run(needle_model *m) {
    const needle_model_info info = info_of(m);
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.max_tokens = 64;
    needle_state *raw = nullptr;
    if (needle_state_create_ex(m, &sp, &raw) != NEEDLE_OK) return std::string("state: ") + needle_last_error();
    State s(raw);
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 12 && i + 4 < info.max_seq_len; ++i) ids.push_back((7 * i + 5) % info.vocab_size);
    std::vector<float> lg(info.out_vocab);
    auto finite = [&] {
        for (float x : lg)
            if (!std::isfinite(x)) return false;
        return true;
    };
    if (!ids.empty()) {
        if (needle_state_prefill(s.get(), nullptr, ids.data(), ids.size(), lg.data(), lg.size()) != NEEDLE_OK)
            return std::string("prefill: ") + needle_last_error();
        if (!finite()) return "prefill logits not finite";
    }
    for (int i = 0; i < 4 && needle_state_pos(s.get()) < info.max_seq_len; ++i) {
        if (needle_state_decode(s.get(), uint32_t(i + 3) % info.vocab_size, lg.data(), lg.size()) != NEEDLE_OK)
            return std::string("decode: ") + needle_last_error();
        if (!finite()) return "decode logits not finite";
    }
    return "";
}

}  // namespace

TEST_CASE("v3 corruption: the 1,512 tiny3 single-field corruptions") {
    const std::vector<uint8_t> good = fixtures::read_bytes(fixtures::v3("models/tiny3.cact"));
    std::ifstream f(fixtures::v3("corruption/tiny3.verdicts.tsv"));
    REQUIRE(f);
    std::string line;
    size_t cases = 0, err_refused = 0, ok_ran = 0, ok_refused = 0, defect_refused = 0;
    std::vector<uint8_t> bytes;
    while (std::getline(f, line)) {
        const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
        const std::string name = line.substr(0, t1), verdict = line.substr(t1 + 1, t2 - t1 - 1);
        CAPTURE(name);
        REQUIRE(corrupt(good, name, bytes));
        ++cases;
        needle_model *m = nullptr;
        const needle_status st = needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &m);
        const std::string msg = needle_last_error();
        Model hold(m);
        if (verdict != "ok") {
            INFO("verdict " << verdict << " but loaded");
            CHECK(st != NEEDLE_OK);
            CHECK(!msg.empty());
            (verdict == "err" ? err_refused : defect_refused) += st != NEEDLE_OK;
            continue;
        }
        if (st != NEEDLE_OK) {
            CHECK(!msg.empty());
            if (name.find(" offset = 0x0") == std::string::npos && name.find(" offset = 0x1") == std::string::npos)
                MESSAGE("ok case refused: " << name << ": " << msg);  // the rest: blobs inside the directory
            ++ok_refused;
            continue;
        }
        const std::string bad = run(m);
        INFO(bad);
        CHECK(bad.empty());
        ok_ran += bad.empty();
    }
    CHECK(cases == 1512);
    MESSAGE("tiny3 corruptions: " << cases << " cases; err refused " << err_refused << "/677; defect refused "
                                  << defect_refused << "/1; ok loaded and ran " << ok_ran << ", ok refused "
                                  << ok_refused << " (of 834)");
    CHECK(err_refused == 677);
    CHECK(defect_refused == 1);
}

// Found by fuzz_load: a finite but huge codebook level passes the ordering checks, then every CQ
// product overflows and the logits are NaN. The loader bounds the levels instead.
TEST_CASE("v3 corruption: a huge codebook level is refused") {
    const std::vector<uint8_t> good = fixtures::read_bytes(fixtures::v3("models/tiny3.cact"));
    for (const uint32_t level : {3u, 11u, 27u}) {
        CAPTURE(level);
        std::vector<uint8_t> bytes = good;
        const float huge = 3.0e36f;
        uint32_t bits;
        std::memcpy(&bits, &huge, 4);
        put(bytes, 196 + 4 * size_t(level), bits, 4);
        needle_model *m = nullptr;
        CHECK(needle_model_load_memory(bytes.data(), bytes.size(), nullptr, &m) == NEEDLE_E_FORMAT);
        CHECK(m == nullptr);
        CHECK(std::string(needle_last_error()).find("codebook: level " + std::to_string(level)) == 0);
    }
}
