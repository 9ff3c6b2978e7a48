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
    if (opt_.tool_choice == ToolChoice::Required && tool_texts_.empty())
        fail(NEEDLE_E_INVALID_ARGUMENT, "chat: tool_choice required needs at least one tool");
    // §9: retrieval above retrieval_k tools, when the model has the contrastive head [C: without
    // the head every tool is rendered, so the whole block must fit].
    const bool retrieve = opt_.retrieval_k > 0 && tool_texts_.size() > opt_.retrieval_k &&
                          model_->probe_head_dim(ProbeHead::Contrastive) > 0;
    check_fit(retrieve);  // before any grammar or embedding work

    const ModelInfo &mi = model_->info();
    token_bytes_ = std::make_unique<TokenBytes>(*tok_);
    go_.require_required = opt_.require_required;
    std::vector<uint32_t> all(tool_texts_.size());
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    if (retrieve) {
        // Every schema is compiled once here, so a bad one fails create whatever a turn selects;
        // each selection then compiles its own grammar (an unselected tool is unreachable).
        std::vector<const JsonValue *> every;
        for (const JsonValue &t : tools_.items) every.push_back(&t);
        Grammar::compile(every, go_);
        index_ = std::make_unique<ToolIndex>(model_, tool_texts_, opt_.tool_index_path);
    } else {
        std::string text;
        std::vector<uint32_t> ids;
        prefix_of(all, text, ids);
        commit_selection(all, std::move(text), std::move(ids));
    }
    step_ = model_->new_workspace(1);
    batch_ = model_->new_workspace(std::min<uint32_t>(32, mi.max_seq_len));
    logits_.resize(mi.vocab_size);
    mask_.resize((mi.vocab_size + 63) / 64);
    feed_ids_.reserve(mi.max_seq_len);
    gen_.reserve(mi.max_seq_len);
    transcript_.reserve(mi.max_seq_len);
    turn_.payload.reserve(size_t(mi.max_seq_len) * 8);
    // The static prefix is prefilled by the first turn (a chat used only to render costs no
    // forward pass) and kept from then on for every reset.
}

Chat::~Chat() = default;

void Chat::parse_tools(std::string_view tools_json) {
    // The count first, by a scan that allocates nothing: a huge list is refused before parsing.
    const size_t n = count_array_items(tools_json);
    if (n > kMaxTools)
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tools_json lists %zu tools; at most %zu are accepted", n, kMaxTools));
    tools_ = parse_json(tools_json);  // INVALID_ARGUMENT with a specific message
    if (tools_.kind != JsonValue::Kind::Array)
        fail(NEEDLE_E_INVALID_ARGUMENT, "chat: tools_json must be a JSON array of tool schemas");
    tool_texts_.reserve(tools_.items.size());
    tools_text_ = "[";
    for (size_t i = 0; i < tools_.items.size(); ++i) {
        const JsonValue &t = tools_.items[i];
        if (t.kind != JsonValue::Kind::Object)
            fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tool %zu is not a JSON object", i));
        const JsonValue *name = t.find("name");
        if (!name || name->kind != JsonValue::Kind::String)
            fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tool %zu has no string \"name\"", i));
        check_tool_strict(t, i);  // unsatisfiable schemas refused (tool_checks.h)
        // §6.4 [C]: a repeated name keeps its first definition for the grammar (Grammar::compile
        // skips the later ones); all are rendered.
        tool_texts_.emplace_back();
        write_canonical(t, tool_texts_.back());
        if (i) tools_text_ += ',';
        tools_text_ += tool_texts_.back();  // json.dumps of the list: the items' texts joined
    }
    tools_text_ += ']';
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
}

void Chat::reset() {
    if (!at_prefix_ || !seq_ || seq_->pos != prefix_ids_.size()) {
        at_prefix_ = false;  // rewound lazily: the next turn restores (and counts) the prefix
        turns_ = 0;
        last_had_calls_ = false;
    }
}

std::string Chat::turn_text(std::string_view text) const {
    if (turns_ == 0) return render_first_turn_suffix(text);
    return render_later_turn(is_tool_result_turn() ? TurnKind::ToolResults : TurnKind::FollowUp, text);
}

std::string Chat::render(std::string_view text) {
    if (!utf8_valid(text)) fail(NEEDLE_E_INVALID_ARGUMENT, "chat: text is not valid UTF-8");
    std::string turn = turn_text(text);
    if (index_ && !is_tool_result_turn()) {  // §9: a query turn selects its tools
        const std::vector<uint32_t> want = wanted_selection(text);
        if (want != selection_) {
            std::string ptext;
            std::vector<uint32_t> pids;
            prefix_of(want, ptext, pids);
            if (turns_ == 0) {
                commit_selection(want, std::move(ptext), std::move(pids));
            } else {  // §10.3 [C]: the new prefix, the transcript since the old one, the turn
                return ptext + transcript_text_ + turn;
            }
        }
    }
    if (turns_ == 0) return prefix_text_ + turn;
    return turn;
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
        encode_continuation(*tok_, ids_, turn_text(text), out);
    }
}

std::string Chat::complete(std::string_view text, uint32_t max_new_tokens) {
    Envelope e;
    e.peak_ram_mb = peak_rss_mib();
    if (!utf8_valid(text)) {
        set_failure(e, "invalid_input", "the turn text is not valid UTF-8");
        return write_envelope(e);
    }
    if (turns_ == 0) user_text_.clear();  // §7.3: the text every turn since the static prefix
    user_text_.append(text).push_back('\n');
    const uint32_t Tmax = model_->info().max_seq_len;
    const bool tool_results = is_tool_result_turn();
    turn_ids(text, feed_ids_);
    // §9: a query turn selects its tools; a tool-result turn keeps the previous selection. A
    // follow-up query that changes it replays the transcript after the new prefix (§10.3 [C]).
    bool replay = false;
    if (index_ && !tool_results) {
        const std::vector<uint32_t> want = wanted_selection(text);
        if (want != selection_) {
            std::string ptext;
            std::vector<uint32_t> pids;
            try {
                prefix_of(want, ptext, pids);
            } catch (const Error &err) {
                if (err.code() != NEEDLE_E_CONTEXT_FULL) throw;
                set_failure(e, "context_full", err.what());
                return write_envelope(e);
            }
            const size_t replayed = turns_ > 0 ? transcript_.size() : 0;
            if (pids.size() + replayed + feed_ids_.size() + 1 > Tmax) {
                set_failure(e, "context_full",
                            strf("context full: the new tool selection's prefix (%zu tokens), the conversation "
                                 "(%zu) and the turn (%zu) do not fit max_seq_len %u; call reset",
                                 pids.size(), replayed, feed_ids_.size(), Tmax));
                return write_envelope(e);
            }
            replay = turns_ > 0;
            commit_selection(want, std::move(ptext), std::move(pids));
        }
    }
    const bool rewound = replay || (!at_prefix_ && turns_ == 0);
    const size_t replayed = replay ? transcript_.size() : 0;
    const size_t restored = (rewound && !have_snapshot_ ? prefix_ids_.size() : 0) + replayed;  // run this turn
    const size_t base = rewound ? prefix_ids_.size() + replayed : seq_->pos;
    if (base + feed_ids_.size() + 1 > Tmax) {  // room for the turn and one token
        // A reset frees nothing on a new conversation, nor when the turn alone would not fit
        // after the static prefix either: then the text itself is too long.
        const bool too_long = prefix_ids_.size() + feed_ids_.size() + 1 > Tmax;
        set_failure(e, "context_full",
                    strf("context full: the turn of %zu tokens at position %zu does not fit max_seq_len %u; %s",
                         feed_ids_.size(), base, Tmax,
                         turns_ == 0 ? "the query is too long for this model and tools (a reset frees nothing)"
                         : too_long  ? "the text is too long for this model and tools, even after a reset"
                                     : "call reset"));
        return write_envelope(e);
    }
    auto t0 = std::chrono::steady_clock::now();
    if (rewound) restore_prefix();
    if (replay) {
        feed(*model_, *seq_, *batch_, transcript_.data(), transcript_.size(), nullptr);
    } else if (turns_ == 0) {
        transcript_.clear();
        transcript_text_.clear();
    }
    feed(*model_, *seq_, *batch_, feed_ids_.data(), feed_ids_.size(), logits_.data());
    const double prefill_s = seconds_since(t0);
    at_prefix_ = false;
    if (prefill_s > 0) e.prefill_tps = double(feed_ids_.size() + restored) / prefill_s;
    transcript_.insert(transcript_.end(), feed_ids_.begin(), feed_ids_.end());
    if (index_) transcript_text_ += turn_text(text);  // only a rebuild's render needs the text

    std::string payload = std::move(turn_.payload);  // keeps its capacity: no growth per step
    turn_ = TurnResult{};
    turn_.payload = std::move(payload);
    TurnResult &r = turn_;
    const Stop stop = decode(max_new_tokens, r);
    transcript_.insert(transcript_.end(), gen_.begin(), gen_.end());  // every generated id was fed
    if (index_)
        for (uint32_t id : gen_) append_token_bytes(*tok_, id, transcript_text_);
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
