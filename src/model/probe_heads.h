// The published outputs of the probe heads (model-v2.md §7.3), over any model implementing
// Model::probe_head_output: the confidence probability and the unit contrastive embedding.
#pragma once

#include "model/model.h"

namespace needle {

// σ(confidence logit) of everything seq has been fed. Errors as Model::probe_head_output.
float confidence_probability(const Model &m, const Sequence &seq);

// out[m.probe_head_dim(Contrastive)] = out / sqrt(Σ out² + 1e-12) (the sum in double).
void contrastive_embedding(const Model &m, const Sequence &seq, float *out);

}  // namespace needle
