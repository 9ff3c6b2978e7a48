// Helpers for the C-ABI tests (test_api.cpp, test_generate.cpp): RAII handles, logits
// comparison and a check that a failing call returns a status with a fresh, specific message.
// Uses only needle.h.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "fixtures.h"
#include "needle.h"

namespace api_test {

struct ModelDel {
    void operator()(needle_model *m) const { needle_model_free(m); }
};
struct StateDel {
    void operator()(needle_state *s) const { needle_state_free(s); }
};
struct BatchDel {
    void operator()(needle_batch *b) const { needle_batch_free(b); }
};
using Model = std::unique_ptr<needle_model, ModelDel>;
using State = std::unique_ptr<needle_state, StateDel>;
using Batch = std::unique_ptr<needle_batch, BatchDel>;

inline std::string model_path(const std::string &name) { return fixtures::v2("models/" + name + ".cact"); }

inline Model load(const std::string &path, const needle_model_params *p = nullptr) {
    needle_model *m = nullptr;
    const needle_status st = needle_model_load_file(path.c_str(), p, &m);
    INFO("loading " << path << ": " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(m != nullptr);
    return Model(m);
}

inline State new_state(needle_model *m) {
    needle_state *s = nullptr;
    REQUIRE(needle_state_create(m, &s) == NEEDLE_OK);
    REQUIRE(s != nullptr);
    return State(s);
}

// needle_state_params with struct_size set and the defaults (change fields, then new_state).
inline needle_state_params state_params() {
    needle_state_params p;
    p.struct_size = sizeof p;
    needle_state_params_init(&p);
    return p;
}

inline State new_state(needle_model *m, const needle_state_params &p) {
    needle_state *s = nullptr;
    INFO(needle_last_error());
    REQUIRE(needle_state_create_ex(m, &p, &s) == NEEDLE_OK);
    REQUIRE(s != nullptr);
    return State(s);
}

inline Batch new_batch(needle_model *m, uint32_t capacity) {
    needle_batch *b = nullptr;
    INFO("batch capacity " << capacity);
    REQUIRE(needle_batch_create(m, capacity, &b) == NEEDLE_OK);
    REQUIRE(b != nullptr);
    return Batch(b);
}

inline needle_model_info info_of(const needle_model *m) {
    needle_model_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    REQUIRE(needle_model_get_info(m, &info) == NEEDLE_OK);
    return info;
}

inline std::vector<uint32_t> tokenize(const needle_model *m, const std::string &text, bool bos) {
    size_t n = 0;
    needle_status st = needle_model_tokenize(m, text.data(), text.size(), bos, nullptr, 0, &n);
    REQUIRE((st == NEEDLE_OK || st == NEEDLE_E_BUFFER_TOO_SMALL));
    std::vector<uint32_t> ids(n);
    size_t n2 = 0;
    REQUIRE(needle_model_tokenize(m, text.data(), text.size(), bos, ids.data(), ids.size(), &n2) == NEEDLE_OK);
    REQUIRE(n2 == n);
    return ids;
}

inline std::string detokenize(const needle_model *m, const std::vector<uint32_t> &ids) {
    size_t len = 0;
    const needle_status st = needle_model_detokenize(m, ids.data(), ids.size(), nullptr, 0, &len);
    REQUIRE(st == NEEDLE_E_BUFFER_TOO_SMALL);  // capacity 0 never holds the NUL
    std::vector<char> buf(len + 1, 'x');
    size_t len2 = 0;
    REQUIRE(needle_model_detokenize(m, ids.data(), ids.size(), buf.data(), buf.size(), &len2) == NEEDLE_OK);
    REQUIRE(len2 == len);
    REQUIRE(buf[len] == '\0');
    return std::string(buf.data(), len);
}

// Decodes `token` and returns the logits.
inline std::vector<float> step(needle_state *s, uint32_t token, size_t V) {
    std::vector<float> lg(V, -12345.0f);
    const needle_status st = needle_state_decode(s, token, lg.data(), lg.size());
    INFO("decode: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    return lg;
}

inline std::vector<float> prefill(needle_state *s, needle_batch *b, const std::vector<uint32_t> &ids, size_t V) {
    std::vector<float> lg(V, -12345.0f);
    const needle_status st = needle_state_prefill(s, b, ids.data(), ids.size(), lg.data(), lg.size());
    INFO("prefill: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    return lg;
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline uint32_t argmax(const std::vector<float> &v) {
    return uint32_t(std::max_element(v.begin(), v.end()) - v.begin());  // first maximum = lowest id
}

inline std::string lower(std::string s) {
    for (char &c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// `alternatives` is "a|b|c": true if the text mentions any of them (case-insensitive).
inline bool mentions(const std::string &text, const std::string &alternatives) {
    const std::string t = lower(text);
    size_t start = 0;
    while (true) {
        const size_t bar = alternatives.find('|', start);
        const std::string alt = lower(alternatives.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
        if (!alt.empty() && t.find(alt) != std::string::npos) return true;
        if (bar == std::string::npos) return false;
        start = bar + 1;
    }
}

// Makes the thread's last error a known message, so a later check can tell that the call under
// test wrote its own message.
constexpr uint32_t kPrimeAbi = 0x7A11u;
inline std::string prime_error() {
    REQUIRE(needle_check_abi(kPrimeAbi) == NEEDLE_E_UNSUPPORTED);
    return needle_last_error();
}

}  // namespace api_test

// Runs `call` (a needle_status expression), expects status `want` and a fresh, non-empty message
// that mentions each of the given strings ("a|b" = a or b, case-insensitive).
#define EXPECT_FAIL(want, call, ...)                                                                \
    do {                                                                                           \
        const std::string primed_ = api_test::prime_error();                                       \
        const needle_status st_ = (call);                                                          \
        const std::string msg_ = needle_last_error();                                              \
        INFO("call: " #call "\n  -> " << st_ << " (" << std::string(needle_status_string(st_))   \
                                      << "), wanted " << (want) << " ("                           \
                                      << std::string(needle_status_string(want)) << "), message \"" \
                                      << msg_ << "\"");                                           \
        CHECK(st_ == (want));                                                                      \
        CHECK(!msg_.empty());                                                                      \
        CHECK(msg_ != primed_);                                                                    \
        for (const std::string &sub_ : std::initializer_list<std::string>{__VA_ARGS__}) {          \
            INFO("message should mention: " << sub_);                                              \
            CHECK(api_test::mentions(msg_, sub_));                                                 \
        }                                                                                          \
    } while (0)
