#include "generate/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace needle {

uint32_t argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

Sampler::Sampler(uint32_t vocab_size) : ids_(vocab_size), prob_(vocab_size) {}

void Sampler::reset(const SamplerParams &p) {
    if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("temperature %g must be finite and >= 0", double(p.temperature)));
    if (p.top_k < 0) fail(NEEDLE_E_INVALID_ARGUMENT, strf("top_k %d must be >= 0", p.top_k));
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("top_p %g must be in (0, 1]", double(p.top_p)));
    p_ = p;
    rng_.seed(p.seed);
}

uint32_t Sampler::next(const float *logits) {
    const uint32_t V = uint32_t(ids_.size());
    if (p_.temperature == 0.0f) return argmax(logits, V);

    // Candidates by logit, descending, ties to the lower id (a total order: deterministic).
    for (uint32_t i = 0; i < V; ++i) ids_[i] = i;
    auto by_logit = [&](uint32_t a, uint32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    uint32_t n = (p_.top_k > 0 && uint32_t(p_.top_k) < V) ? uint32_t(p_.top_k) : V;
    std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), by_logit);

    // softmax(logits / T) over the candidates, in double.
    const double mx = logits[ids_[0]];
    double total = 0.0;
    for (uint32_t i = 0; i < n; ++i) {
        prob_[i] = std::exp((double(logits[ids_[i]]) - mx) / double(p_.temperature));
        total += prob_[i];
    }
    // top-p: the shortest prefix whose mass reaches top_p (candidates are sorted by probability).
    if (p_.top_p < 1.0f) {
        double mass = 0.0;
        uint32_t keep = 0;
        while (keep < n) {
            mass += prob_[keep++] / total;
            if (mass >= double(p_.top_p)) break;
        }
        n = keep;
        total = 0.0;
        for (uint32_t i = 0; i < n; ++i) total += prob_[i];
    }
    const double u = double(rng_() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
    double acc = 0.0;
    for (uint32_t i = 0; i < n; ++i) {
        acc += prob_[i];
        if (u < acc) return ids_[i];
    }
    return ids_[n - 1];
}

}  // namespace needle
