#include "generate/generate.h"

#include <chrono>

#include "core/error.h"

namespace needle {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Generator::Generator(const Model &m) : m_(m), logits_(m.info().vocab_size), sampler_(m.info().vocab_size) {
    piece_.reserve(64);
}

needle_status Generator::run(Sequence &seq, Workspace &step, Workspace *batch, std::string_view prompt,
                             const GenerateOptions &opt, needle_token_callback cb, void *user_data,
                             GenerateStats &st) {
    const Tokenizer *tok = m_.tokenizer();
    if (!tok) fail(NEEDLE_E_UNSUPPORTED, "this model has no tokenizer");
    sampler_.reset(opt.sampling);
    st = GenerateStats{};

    prompt_ids_.clear();
    if (seq.pos == 0 && opt.add_bos) prompt_ids_.push_back(tok->bos_id());
    tok->encode(prompt, prompt_ids_);
    if (prompt_ids_.empty()) fail(NEEDLE_E_INVALID_ARGUMENT, "empty prompt: nothing to condition on");
    // The positions this state holds: its max_tokens (its KV memory is sized for them) when
    // the caller set one, else the model's max_seq_len. Past it a Needle 3 state writes beyond
    // its caches, as needle_state_decode and prefill refuse to.
    const uint32_t Tmax = seq.limit ? seq.limit : m_.info().max_seq_len;
    const char *what = Tmax < m_.info().max_seq_len ? "this state's max_tokens" : "max_seq_len";
    if (seq.pos >= Tmax || prompt_ids_.size() + 1 > size_t(Tmax - seq.pos))  // the prompt and one token
        fail(NEEDLE_E_CONTEXT_FULL, strf("prompt of %zu token%s at position %u leaves no room in %s %u",
                                         prompt_ids_.size(), plural(prompt_ids_.size()), seq.pos, what, Tmax));

    auto t0 = std::chrono::steady_clock::now();
    feed(m_, seq, batch ? *batch : step, prompt_ids_.data(), prompt_ids_.size(), logits_.data());
    st.prefill_ms = ms_since(t0);
    st.prompt_tokens = uint32_t(prompt_ids_.size());

    // <|im_end|> ends an assistant turn like EOS (§6 rule 2); neither is streamed nor fed.
    const int64_t im_end = tok->find("<|im_end|>");
    TextStream stream(*tok);
    needle_status status = NEEDLE_OK;
    t0 = std::chrono::steady_clock::now();
    while (true) {
        if (st.generated_tokens == opt.max_tokens) { st.stop_reason = NEEDLE_STOP_MAX_TOKENS; break; }
        const uint32_t id = sampler_.next(logits_.data());
        if (id == tok->eos_id() || int64_t(id) == im_end) { st.stop_reason = NEEDLE_STOP_EOS; break; }
        stream.push(id, piece_);
        ++st.generated_tokens;
        const bool stop = cb && cb(id, piece_.c_str(), piece_.size(), user_data) != 0;
        // Feed the token so the state holds every streamed token; skip the LM head when no
        // further token will be drawn.
        const bool last = stop || st.generated_tokens == opt.max_tokens || seq.pos + 1 >= Tmax;
        feed(m_, seq, step, &id, 1, last ? nullptr : logits_.data());
        if (stop) { st.stop_reason = NEEDLE_STOP_CALLBACK; status = NEEDLE_E_CANCELLED; break; }
        if (seq.pos >= Tmax) { st.stop_reason = NEEDLE_STOP_CONTEXT_FULL; break; }
    }
    st.decode_ms = ms_since(t0);
    stream.finish(piece_);  // a dangling partial character becomes U+FFFD
    if (!piece_.empty() && cb)
        cb(NEEDLE_NO_TOKEN, piece_.c_str(), piece_.size(), user_data);
    return status;
}

}  // namespace needle
