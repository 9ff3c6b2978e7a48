// Test helpers: fixture paths and readers (shared/fixtures, see its READMEs).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fixtures {

// True in a build under AddressSanitizer or ThreadSanitizer (scripts/sanitize.sh): tests that
// measure RSS skip the bound, and the slowest plans run a reduced set.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// ../shared/fixtures, or $NEEDLE_FIXTURES when set.
inline std::string dir() {
    const char *env = std::getenv("NEEDLE_FIXTURES");
    return env && *env ? env : NEEDLE_FIXTURES_DIR;
}
inline std::string v2(const std::string &rel) { return dir() + "/v2/" + rel; }
inline std::string v3(const std::string &rel) { return dir() + "/v3/" + rel; }

inline std::vector<uint8_t> read_bytes(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open fixture " + path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline std::vector<float> read_f32(const std::string &path) {
    const std::vector<uint8_t> b = read_bytes(path);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

inline nlohmann::json read_json(const std::string &path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open fixture " + path);
    return nlohmann::json::parse(f);
}

inline const std::vector<std::string> &v2_models() {
    static const std::vector<std::string> names{"tiny", "odd", "ternary", "needle2"};
    return names;
}

}  // namespace fixtures
