// Which tools a chat renders (tool-calling.md §9) and the static prefix that follows from it
// (§10.3): the cheap size checks of create, the selection of a query turn, and switching to a
// new selection (its prefix, grammar and sequences).
#include <algorithm>

#include "chat/chat.h"
#include "core/error.h"

namespace needle {
namespace chat {

namespace {

// Longest token byte string: a lower bound on the tokens of a text is bytes / this (a cheap
// refusal of a tools block that cannot fit, before tokenising megabytes).
size_t longest_piece(const Tokenizer &tok) {
    size_t m = 1;
    for (uint32_t i = 0; i < tok.size(); ++i) m = std::max(m, tok.token_bytes(i).size());
    return m;
}

uint32_t turn_room(const ModelInfo &mi) { return mi.max_seq_len > kMinTurnRoom ? mi.max_seq_len - kMinTurnRoom : 0; }

}  // namespace

// Without retrieval the whole block must fit; with it, any selection can be the retrieval_k
// largest tools, so those must. First a bound from the byte count alone (no tokenising), then
// with retrieval the tokens of the largest selection (a few tools: cheap).
void Chat::check_fit(bool retrieve) const {
    const ModelInfo &mi = model_->info();
    const uint32_t room = turn_room(mi);
    std::vector<uint32_t> largest;
    size_t block = tools_text_.size();
    if (retrieve) {
        largest.resize(tool_texts_.size());
        for (uint32_t i = 0; i < largest.size(); ++i) largest[i] = i;
        const size_t k = std::min<size_t>(opt_.retrieval_k, largest.size());
        std::nth_element(largest.begin(), largest.begin() + std::ptrdiff_t(k) - 1, largest.end(),
                         [&](uint32_t a, uint32_t b) { return tool_texts_[a].size() > tool_texts_[b].size(); });
        largest.resize(k);
        std::sort(largest.begin(), largest.end());
        block = 1;
        for (uint32_t i : largest) block += tool_texts_[i].size() + 1;
    }
    const size_t bytes = render_static_prefix(system_, "").size() + block;
    if (bytes / longest_piece(*tok_) + 1 > room)
        fail(NEEDLE_E_CONTEXT_FULL,
             strf("chat: the static prefix (%zu bytes of system and %s) cannot fit max_seq_len %u with %u "
                  "positions left for the conversation",
                  bytes, retrieve ? "the largest tools retrieval may select" : "tools", mi.max_seq_len, kMinTurnRoom));
    if (retrieve) {
        std::string text;
        std::vector<uint32_t> ids;
        prefix_of(largest, text, ids);  // CONTEXT_FULL when it does not fit
    }
}

std::string Chat::tools_block(const std::vector<uint32_t> &sel) const {
    size_t n = 2;
    for (uint32_t i : sel) n += tool_texts_[i].size() + 1;
    std::string s;
    s.reserve(n);
    s += '[';
    for (size_t j = 0; j < sel.size(); ++j) {
        if (j) s += ',';
        s += tool_texts_[sel[j]];
    }
    s += ']';
    return s;
}

void Chat::prefix_of(const std::vector<uint32_t> &sel, std::string &text, std::vector<uint32_t> &ids) const {
    const ModelInfo &mi = model_->info();
    text = render_static_prefix(system_, tools_block(sel));
    ids.clear();
    ids.push_back(ids_.bos);
    tok_->encode(text, ids);
    if (ids.size() > turn_room(mi))
        fail(NEEDLE_E_CONTEXT_FULL, strf("chat: the static prefix%s is %zu tokens; max_seq_len %u leaves fewer "
                                         "than %u positions for the conversation",
                                         index_ || sel.size() < tool_texts_.size() ? " of the selected tools" : "",
                                         ids.size(), mi.max_seq_len, kMinTurnRoom));
}

std::vector<uint32_t> Chat::wanted_selection(std::string_view text) {
    if (!sel_cached_ || sel_query_ != text) {  // render() then complete() embed the query once
        sel_result_ = index_->select(text, opt_.retrieval_k);
        sel_query_.assign(text.data(), text.size());
        sel_cached_ = true;
    }
    return sel_result_;
}

void Chat::commit_selection(const std::vector<uint32_t> &sel, std::string text, std::vector<uint32_t> ids) {
    selection_ = sel;
    prefix_text_ = std::move(text);
    prefix_ids_ = std::move(ids);
    grammar_tools_.clear();
    for (uint32_t i : sel) grammar_tools_.push_back(&tools_.items[i]);
    // Compiled with the grammar off too: the post-decode checks (§6.4) still apply.
    grammar_ = Grammar::compile(grammar_tools_, go_);
    matcher_.reset();
    if (opt_.grammar) matcher_ = std::make_unique<GrammarMatcher>(grammar_, *token_bytes_);
    // The sinks are the static prefix (§10.3): a prefix of another length needs new sequences.
    const uint32_t sinks = opt_.sinks ? uint32_t(prefix_ids_.size()) : 0;
    if (!seq_ || sinks != seq_sinks_) {
        SequenceOptions so;
        so.kv_type = opt_.kv_type;
        so.sink_tokens = sinks;
        so.probe_heads = true;  // the confidence head (§8) pools while the conversation is fed
        seq_ = model_->new_sequence(so);
        prefix_seq_ = model_->new_sequence(so);
        seq_sinks_ = sinks;
    }
    have_snapshot_ = false;
    at_prefix_ = false;
}

}  // namespace chat
}  // namespace needle
