#include "model/probe_heads.h"

#include <cmath>

namespace needle {

bool Model::confidence(const Sequence &seq, float *p) const {
    if (probe_head_dim(ProbeHead::Confidence) == 0) return false;
    float logit = 0.0f;
    probe_head_output(seq, ProbeHead::Confidence, &logit);
    *p = float(1.0 / (1.0 + std::exp(-double(logit))));
    return true;
}

void contrastive_embedding(const Model &m, const Sequence &seq, float *out) {
    m.probe_head_output(seq, ProbeHead::Contrastive, out);
    const uint32_t d = m.probe_head_dim(ProbeHead::Contrastive);
    double ss = 0.0;
    for (uint32_t i = 0; i < d; ++i) ss += double(out[i]) * double(out[i]);
    const double inv = 1.0 / std::sqrt(ss + 1e-12);
    for (uint32_t i = 0; i < d; ++i) out[i] = float(double(out[i]) * inv);
}

}  // namespace needle
