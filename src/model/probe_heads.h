// The published contrastive output (model-v2.md §7.3) over any model implementing
// Model::probe_head_output; the confidence probability is Model::confidence.
#pragma once

#include "model/model.h"

namespace needle {

// out[m.probe_head_dim(Contrastive)] = out / sqrt(Σ out² + 1e-12) (the sum in double).
void contrastive_embedding(const Model &m, const Sequence &seq, float *out);

}  // namespace needle
