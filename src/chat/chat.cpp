#include "chat/chat.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "chat/tool_checks.h"
#include "model/state_io.h"

namespace needle {
namespace chat {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Longest token byte string: a lower bound on the tokens of a text is bytes / this (a cheap
// refusal of a tools block that cannot fit, before tokenising megabytes).
size_t longest_piece(const Tokenizer &tok) {
    size_t m = 1;
    for (uint32_t i = 0; i < tok.size(); ++i) m = std::max(m, tok.token_bytes(i).size());
    return m;
}

}  // namespace

double combine_confidence(double p_head, double p_decode) {
    const double p = p_head < 0.0 ? p_decode : std::min(p_head, p_decode);
    return std::round(p * 1e4) / 1e4;
}


Chat::Chat(std::shared_ptr<const Model> model, std::string_view system, std::string_view tools_json,
           const ChatOptions &opt)
    : model_(std::move(model)), opt_(opt), system_(system) {
    tok_ = model_->tokenizer();
    if (!tok_ || tok_->size() == 0) fail(NEEDLE_E_UNSUPPORTED, "chat: the model has no tokenizer");
    if (!utf8_valid(system)) fail(NEEDLE_E_INVALID_ARGUMENT, "chat: system text is not valid UTF-8");
    ids_ = marker_ids(*tok_);
    parse_tools(tools_json);
    if (opt_.tool_choice == ToolChoice::Required && grammar_tools_.empty())
        fail(NEEDLE_E_INVALID_ARGUMENT, "chat: tool_choice required needs at least one tool");

    const ModelInfo &mi = model_->info();
    const uint32_t room = mi.max_seq_len > kMinTurnRoom ? mi.max_seq_len - kMinTurnRoom : 0;
    prefix_text_ = render_static_prefix(system_, tools_text_);
    if (prefix_text_.size() / longest_piece(*tok_) + 1 > room)
        fail(NEEDLE_E_CONTEXT_FULL, strf("chat: the static prefix (%zu bytes of system and tools) cannot fit "
                                         "max_seq_len %u with %u positions left for the conversation",
                                         prefix_text_.size(), mi.max_seq_len, kMinTurnRoom));
    prefix_ids_.push_back(ids_.bos);
    tok_->encode(prefix_text_, prefix_ids_);
    if (prefix_ids_.size() > room)
        fail(NEEDLE_E_CONTEXT_FULL, strf("chat: the static prefix is %zu tokens; max_seq_len %u leaves fewer "
                                         "than %u positions for the conversation",
                                         prefix_ids_.size(), mi.max_seq_len, kMinTurnRoom));

    // Compiled with the grammar off too: the schemas are validated the same way, and the
    // post-decode checks (§6.4) still apply to a free-decoded payload.
    token_bytes_ = std::make_unique<TokenBytes>(*tok_);
    GrammarOptions go;
    go.require_required = opt_.require_required;
    grammar_ = Grammar::compile(grammar_tools_, go);
    if (opt_.grammar) matcher_ = std::make_unique<GrammarMatcher>(grammar_, *token_bytes_);
    SequenceOptions so;
    so.kv_type = opt_.kv_type;
    so.sink_tokens = opt_.sinks ? uint32_t(prefix_ids_.size()) : 0;
    so.probe_heads = true;  // the confidence head (§8) pools while the conversation is fed
    seq_ = model_->new_sequence(so);
    prefix_seq_ = model_->new_sequence(so);
    step_ = model_->new_workspace(1);
    batch_ = model_->new_workspace(std::min<uint32_t>(32, mi.max_seq_len));
    logits_.resize(mi.vocab_size);
    mask_.resize((mi.vocab_size + 63) / 64);
    feed_ids_.reserve(mi.max_seq_len);
    gen_.reserve(mi.max_seq_len);
    turn_.payload.reserve(size_t(mi.max_seq_len) * 8);
    // The static prefix is prefilled by the first turn (a chat used only to render costs no
    // forward pass) and kept from then on for every reset.
}

Chat::~Chat() = default;

void Chat::parse_tools(std::string_view tools_json) {
    tools_ = parse_json(tools_json);  // INVALID_ARGUMENT with a specific message
    if (tools_.kind != JsonValue::Kind::Array)
        fail(NEEDLE_E_INVALID_ARGUMENT, "chat: tools_json must be a JSON array of tool schemas");
    for (size_t i = 0; i < tools_.items.size(); ++i) {
        const JsonValue &t = tools_.items[i];
        if (t.kind != JsonValue::Kind::Object)
            fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tool %zu is not a JSON object", i));
        const JsonValue *name = t.find("name");
        if (!name || name->kind != JsonValue::Kind::String)
            fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tool %zu has no string \"name\"", i));
        check_tool_strict(t, i);  // unsatisfiable schemas refused (tool_checks.h)
        // §6.4 [C]: a repeated name keeps its first definition for the grammar (all are rendered).
        bool seen = false;
        for (const JsonValue *g : grammar_tools_) seen = seen || g->find("name")->text == name->text;
        if (!seen) grammar_tools_.push_back(&t);
    }
    write_canonical(tools_, tools_text_);
}

// The first call prefills the static prefix and keeps a copy of the state after it; every later
// call (reset) copies it back: bit-identical to prefilling again (§10.4), without the forward.
void Chat::restore_prefix() {
    if (have_snapshot_) {
        copy_sequence(*seq_, *prefix_seq_);
    } else {
        seq_->reset();
        feed(*model_, *seq_, *batch_, prefix_ids_.data(), prefix_ids_.size(), nullptr);
        copy_sequence(*prefix_seq_, *seq_);
        have_snapshot_ = true;
    }
    at_prefix_ = true;
    turns_ = 0;
    last_had_calls_ = false;
}

void Chat::reset() {
    if (!at_prefix_ || seq_->pos != prefix_ids_.size()) {
        at_prefix_ = false;  // rewound lazily: the next turn restores (and counts) the prefix
        turns_ = 0;
        last_had_calls_ = false;
    }
}

std::string Chat::render(std::string_view text) const {
    if (!utf8_valid(text)) fail(NEEDLE_E_INVALID_ARGUMENT, "chat: text is not valid UTF-8");
    if (turns_ == 0) return prefix_text_ + render_first_turn_suffix(text);
    return render_later_turn(is_tool_result_turn() ? TurnKind::ToolResults : TurnKind::FollowUp, text);
}

void Chat::turn_ids(std::string_view text, std::vector<uint32_t> &out) const {
    out.clear();
    if (turns_ == 0) {
        // Re-encode from the closing </tools> marker so the ids continue the prefix exactly.
        std::string s = "</tools>";
        s += render_first_turn_suffix(text);
        encode_continuation(*tok_, ids_, s, out);
        out.erase(out.begin());  // the </tools> id, already in the prefix
    } else {
        encode_continuation(*tok_, ids_, render(text), out);
    }
}

std::string Chat::complete(std::string_view text, uint32_t max_new_tokens) {
    Envelope e;
    e.peak_ram_mb = peak_rss_mib();
    if (!utf8_valid(text)) {
        set_failure(e, "invalid_input", "the turn text is not valid UTF-8");
        return write_envelope(e);
    }
    if (turns_ == 0) user_text_.clear();
    user_text_.append(text).push_back('\n');
    const bool rewound = !at_prefix_ && turns_ == 0;
    const size_t restored = rewound && !have_snapshot_ ? prefix_ids_.size() : 0;  // run this turn
    const uint32_t base = rewound ? uint32_t(prefix_ids_.size()) : seq_->pos;
    turn_ids(text, feed_ids_);
    const uint32_t Tmax = model_->info().max_seq_len;
    if (size_t(base) + feed_ids_.size() + 1 > Tmax) {  // room for the turn and one token
        set_failure(e, "context_full",
                    strf("context full: the turn of %zu tokens at position %u does not fit max_seq_len %u; "
                         "call reset", feed_ids_.size(), base, Tmax));
        return write_envelope(e);
    }
    const bool tool_results = is_tool_result_turn();
    auto t0 = std::chrono::steady_clock::now();
    if (rewound) restore_prefix();
    feed(*model_, *seq_, *batch_, feed_ids_.data(), feed_ids_.size(), logits_.data());
    const double prefill_s = seconds_since(t0);
    at_prefix_ = false;
    if (prefill_s > 0) e.prefill_tps = double(feed_ids_.size() + restored) / prefill_s;

    std::string payload = std::move(turn_.payload);  // keeps its capacity: no growth per step
    turn_ = TurnResult{};
    turn_.payload = std::move(payload);
    TurnResult &r = turn_;
    const Stop stop = decode(max_new_tokens, r);
    if (r.decode_s > 0) e.decode_tps = r.generated / r.decode_s;
    stats_ = TurnStats{};
    stats_.prefill_tokens = uint32_t(feed_ids_.size() + restored);
    stats_.generated_tokens = r.generated;
    stats_.call_tokens = r.n_call;
    stats_.prefill_ms = prefill_s * 1e3;
    stats_.decode_ms = r.decode_s * 1e3;
    stats_.grammar_ms = r.grammar_s * 1e3;
    ++turns_;
    finish_envelope(r, stop, e);
    last_had_calls_ = e.success && e.function_calls != "[]";
    // A withheld call (§7.3) is not the model's "[]": the turn stays "call".
    e.respond = e.respond || (e.success && tool_results && e.function_calls == "[]" && e.suppressed_calls == "[]");
    e.peak_ram_mb = peak_rss_mib();
    return write_envelope(e);
}

}  // namespace chat
}  // namespace needle
