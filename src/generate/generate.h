// Text generation on one sequence: prompt pass, then sample / stream / feed until a stop
// (tokenizer-and-prompt.md §6). Buffers are sized once per state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "generate/sampler.h"
#include "model/model.h"
#include "needle.h"

namespace needle {

struct GenerateOptions {
    uint32_t max_tokens = 128;
    SamplerParams sampling;
    bool add_bos = true;
};

struct GenerateStats {
    uint32_t prompt_tokens = 0, generated_tokens = 0, stop_reason = NEEDLE_STOP_NONE;
    double prefill_ms = 0.0, decode_ms = 0.0;
};

class Generator {
public:
    explicit Generator(const Model &m);
    // Returns NEEDLE_OK or NEEDLE_E_CANCELLED; throws Error for invalid arguments, a model
    // without tokenizer, or a prompt that does not fit (nothing fed then).
    needle_status run(Sequence &seq, Workspace &step, Workspace *batch, std::string_view prompt,
                      const GenerateOptions &opt, needle_token_callback cb, void *user_data,
                      GenerateStats &stats);

private:
    const Model &m_;
    std::vector<float> logits_;
    std::vector<uint32_t> prompt_ids_;
    Sampler sampler_;
    std::string piece_;
};

}  // namespace needle
