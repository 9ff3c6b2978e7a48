// Next-token choice from logits: greedy argmax or temperature / top-k / top-p sampling from a
// seeded generator (tokenizer-and-prompt.md §6). Scratch is sized once, at construction.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace needle {

struct SamplerParams {
    float temperature = 0.0f;  // 0 = greedy
    int32_t top_k = 0;         // 0 = all
    float top_p = 1.0f;        // 1 = all
    uint64_t seed = 0;
};

class Sampler {
public:
    explicit Sampler(uint32_t vocab_size);
    // Throws Error(NEEDLE_E_INVALID_ARGUMENT) for a negative/non-finite temperature, top_k < 0
    // or top_p outside (0, 1]. Restarts the generator from the seed.
    void reset(const SamplerParams &p);
    // Argmax (ties to the lowest id) when greedy, else a draw. Allocates nothing.
    uint32_t next(const float *logits);

private:
    SamplerParams p_;
    std::mt19937_64 rng_;  // its output sequence is fixed by the C++ standard
    std::vector<uint32_t> ids_;
    std::vector<double> prob_;
};

// Index of the largest value, ties to the lowest index.
uint32_t argmax(const float *v, uint32_t n);

}  // namespace needle
