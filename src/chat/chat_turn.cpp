// The decode loop of one assistant turn (tool-calling.md §4, §6.3) and its envelope (§5, §7).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "chat/chat.h"
#include "core/error.h"
#include "generate/sampler.h"

namespace needle {
namespace chat {

namespace {
enum Phase { kFree = 0, kCall = 1, kAfterCall = 2 };

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double log_softmax_of(const float *logits, uint32_t V, uint32_t id) {
    float mx = logits[0];
    for (uint32_t i = 1; i < V; ++i) mx = std::max(mx, logits[i]);
    double sum = 0.0;
    for (uint32_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - double(mx));
    return double(logits[id]) - double(mx) - std::log(sum);
}
}  // namespace


// Greedy choice of the next id for `phase` (§4: argmax, ties to the lowest id) over the ids
// the phase allows. Sets `error` (and returns 0) when nothing is allowed: an engine bug.
uint32_t Chat::choose(int phase, bool forbid_empty_list, TurnResult &r) {
    const uint32_t V = uint32_t(logits_.size());
    const float *lg = logits_.data();
    if (phase == kAfterCall)  // §6.3: after </tool_call> only <|im_end|> or EOS
        return lg[ids_.im_end] > lg[ids_.eos] || (lg[ids_.im_end] == lg[ids_.eos] && ids_.im_end < ids_.eos)
                   ? ids_.im_end : ids_.eos;
    if (phase == kFree) {
        if (opt_.tool_choice == ToolChoice::Required && r.generated == 0) return ids_.tool_call;
        const bool no_stop = opt_.stop_needs_call && opt_.tool_choice != ToolChoice::None;
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < V; ++i) {
            if (no_stop && (i == ids_.eos || i == ids_.im_end)) continue;
            if (opt_.tool_choice == ToolChoice::None && i == ids_.tool_call) continue;
            if (best == UINT32_MAX || lg[i] > lg[best]) best = i;
        }
        return best;
    }
    if (matcher_) {
        const size_t allowed = matcher_->fill_mask(mask_.data());
        if (forbid_empty_list && r.payload.size() < 2) {
            // tool_choice required: the list must not close empty ("[]" at the payload start).
            for (uint32_t w = 0; w < mask_.size(); ++w)
                for (uint64_t bits = mask_[w]; bits; bits &= bits - 1) {
                    const uint32_t id = w * 64 + uint32_t(__builtin_ctzll(bits));
                    const std::string_view b = token_bytes_->bytes(id);
                    const size_t k = r.payload.size();
                    bool empty_list = true;
                    for (size_t j = 0; j < 2 && empty_list; ++j) {
                        const char c = j < k ? r.payload[j] : (j - k < b.size() ? b[j - k] : '\0');
                        empty_list = c == "[]"[j];
                    }
                    if (empty_list) mask_[w] &= ~(uint64_t(1) << (id % 64));
                }
        }
        uint32_t best = UINT32_MAX;
        for (uint32_t w = 0; w < mask_.size(); ++w)
            for (uint64_t bits = mask_[w]; bits; bits &= bits - 1) {
                const uint32_t id = w * 64 + uint32_t(__builtin_ctzll(bits));
                if (id < V && (best == UINT32_MAX || lg[id] > lg[best])) best = id;
            }
        if (allowed == 0 || best == UINT32_MAX) {
            r.internal = "internal: the grammar allowed no token inside the call (payload so far: " + r.payload + ")";
            return 0;
        }
        return best;
    }
    (void)forbid_empty_list;
    return argmax(lg, V);
}

Chat::Stop Chat::decode(uint32_t max_new_tokens, TurnResult &r) {
    const uint32_t V = uint32_t(logits_.size());
    const uint32_t Tmax = model_->info().max_seq_len;
    gen_.clear();
    r.payload.clear();
    if (matcher_) matcher_->reset();
    // tool_choice required keeps "[]" possible on a tool-result turn, so run() can finish [C].
    const bool forbid_empty = opt_.tool_choice == ToolChoice::Required && !is_tool_result_turn();
    int phase = kFree;
    auto t0 = std::chrono::steady_clock::now();
    Stop stop = Stop::Budget;
    while (true) {
        if (r.generated == max_new_tokens) { stop = Stop::Budget; break; }
        const bool in_call = phase == kCall && matcher_;
        auto g0 = std::chrono::steady_clock::now();
        const uint32_t id = choose(phase, forbid_empty, r);
        if (in_call) r.grammar_s += seconds_since(g0);
        if (!r.internal.empty()) { stop = Stop::Internal; break; }
        const double lp = log_softmax_of(logits_.data(), V, id);  // unmasked softmax (§8)
        r.logp_all += lp;
        if (id == ids_.eos || id == ids_.im_end) { stop = Stop::Eos; break; }
        if (phase == kCall) {
            r.logp_call += lp;
            ++r.n_call;
            g0 = std::chrono::steady_clock::now();
            if (matcher_ && id != ids_.tool_call_end && !matcher_->accept(id)) {
                r.internal = "internal: the grammar refused the token it allowed";
                stop = Stop::Internal;
                break;
            }
            if (in_call) r.grammar_s += seconds_since(g0);
            if (id == ids_.tool_call_end) phase = kAfterCall;
            else append_token_bytes(*tok_, id, r.payload);
        } else if (phase == kFree && id == ids_.tool_call) {
            phase = kCall;
        }
        gen_.push_back(id);
        ++r.generated;
        const bool last = r.generated == max_new_tokens || seq_->pos + 1 >= Tmax;
        feed(*model_, *seq_, *step_, &id, 1, last ? nullptr : logits_.data());
        if (seq_->pos >= Tmax) { stop = Stop::Context; break; }
    }
    r.decode_s = seconds_since(t0);
    return stop;
}

namespace {
// The §3.4 shape of a call list: an array of {"name": declared string, "arguments": object}.
// "" or what is wrong. (The grammar guarantees it; without the grammar it is checked here.)
std::string check_calls_shape(const JsonValue &calls, const std::vector<const JsonValue *> &tools) {
    if (calls.kind != JsonValue::Kind::Array) return "the call payload is not a JSON array";
    for (size_t i = 0; i < calls.items.size(); ++i) {
        const JsonValue &c = calls.items[i];
        const JsonValue *name = c.kind == JsonValue::Kind::Object ? c.find("name") : nullptr;
        const JsonValue *args = c.kind == JsonValue::Kind::Object ? c.find("arguments") : nullptr;
        if (!name || name->kind != JsonValue::Kind::String || !args || args->kind != JsonValue::Kind::Object)
            return strf("call %zu is not {\"name\": string, \"arguments\": object}", i);
        bool declared = false;
        for (const JsonValue *t : tools) declared = declared || t->find("name")->text == name->text;
        if (!declared) return "call " + std::to_string(i) + " names an undeclared tool: " + name->text;
    }
    return "";
}
}  // namespace

// §8 [C]: σ(confidence head) pooled online over every position the state was fed (BOS, the
// prompt, the generated ids through </tool_call>; the stop token is never fed), with the
// state's window and sinks as head window. -1 when the model has no confidence head.
double Chat::head_probability() const {
    if (model_->probe_head_dim(ProbeHead::Confidence) != 1 || !seq_->options.probe_heads) return -1.0;
    float logit = 0.0f;
    model_->probe_head_output(*seq_, ProbeHead::Confidence, &logit);
    return 1.0 / (1.0 + std::exp(-double(logit)));
}

void Chat::finish_envelope(const TurnResult &r, Stop stop, Envelope &e) {
    const Completion c = parse_completion(*tok_, ids_, gen_.data(), gen_.size());
    e.reasoning = c.reasoning;  // filled even on failure [O]
    // §8 [C]: exp(mean log p) over the call tokens; over all tokens when there is no call.
    stats_.p_decode = r.n_call ? std::exp(r.logp_call / r.n_call)
                               : (r.generated ? std::exp(r.logp_all / r.generated) : 0.0);
    stats_.p_head = head_probability();
    e.confidence = combine_confidence(stats_.p_head, stats_.p_decode);
    if (stop == Stop::Internal) return set_failure(e, "internal", r.internal);
    if (opt_.tool_choice == ToolChoice::None) {  // no call possible: the loop is finished
        e.respond = true;
        return;
    }
    if (!c.call_closed) {
        // §4 [O] gives the message for a budget that ran out inside the call payload; one that ran
        // out before <tool_call> keeps the code but says so [C] (nothing was cut off).
        if (stop == Stop::Budget)
            return set_failure(e, "truncated", c.call_opened ? kTruncatedMessage
                                                             : "token budget exhausted before a tool call started");
        if (stop == Stop::Context)
            return set_failure(e, "context_full", "context full: the conversation reached max_seq_len; call reset");
        if (c.call_opened) return set_failure(e, "schema_violation", "the turn ended inside the call list");
        return set_failure(e, "no_call", "the turn ended without a call list");
    }
    JsonValue calls;
    try {
        calls = parse_json(c.payload);
    } catch (const Error &err) {
        return set_failure(e, opt_.grammar ? "internal" : "schema_violation",
                           std::string("the call payload is not valid JSON: ") + err.what());
    }
    // The envelope is strict JSON (§7.1 [C]): a NaN or Infinity the payload carries (grammar off,
    // or a schema whose enum/const holds one) cannot be handed over as a call; it is withheld
    // with its non-finite numbers written as null.
    std::string canon;
    write_canonical(calls, canon, true);
    std::string bad = check_calls_shape(calls, grammar_tools_);
    if (bad.empty() && grammar_) bad = post_check(*grammar_, calls);
    if (bad.empty() && has_non_finite(calls))
        bad = "the call carries a NaN or infinite number, which JSON cannot represent";
    if (!bad.empty()) {
        set_failure(e, "schema_violation", bad);
        if (calls.kind == JsonValue::Kind::Array) e.suppressed_calls = canon;  // never dropped silently
        return;
    }
    e.function_calls = canon;
    if (opt_.validation != ValidationMode::Off && !calls.items.empty()) {
        ValidationResult v = validate_calls(calls, user_text_, opt_.validation);
        e.function_calls = std::move(v.function_calls);
        e.suppressed_calls = std::move(v.suppressed_calls);
        e.validation = std::move(v.validation);
    }
}

}  // namespace chat
}  // namespace needle
