// SHA-256 (FIPS 180-4), written here for the tool index fingerprints (tool-calling.md §9); no
// dependency. Incremental: update() any number of times, then final().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace needle {

class Sha256 {
public:
    using Digest = std::array<uint8_t, 32>;
    Sha256();
    void update(const void *data, size_t n);
    Digest final();  // the object is spent afterwards
    static Digest of(std::string_view bytes);

private:
    void block(const uint8_t *p);
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t fill_ = 0;
    uint64_t total_ = 0;
};

}  // namespace needle
