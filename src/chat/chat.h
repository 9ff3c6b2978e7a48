// One tool-calling conversation on a Needle model (tool-calling.md §1): parsed tools and their
// canonical JSON, the static prefix kept prefilled, the grammar-constrained greedy decode of
// each turn, and its envelope. The model code knows nothing of this layer.
// Use from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/completion.h"
#include "chat/envelope.h"
#include "chat/grammar.h"
#include "chat/json.h"
#include "chat/retrieval.h"
#include "chat/template.h"
#include "chat/validation.h"
#include "model/model.h"

namespace needle {
namespace chat {

enum class ToolChoice : int32_t { Auto = 0, Required = 1, None = 2 };

struct ChatOptions {
    ToolChoice tool_choice = ToolChoice::Auto;
    KvType kv_type = KvType::F32;
    bool grammar = true;                      // §6: constrain the call payload
    bool require_required = true;             // §6.4 switch: '}' only after every required key
    bool stop_needs_call = true;              // §6.3 switch: EOS / <|im_end|> masked until a call list closed
    bool sinks = true;                        // §10.3: the static prefix pinned as KV sinks
    ValidationMode validation = ValidationMode::Off;  // §7.3 [C] serving layer (validation.h)
    // §9: with more than retrieval_k tools (and a contrastive head), each query turn renders
    // only the retrieval_k best; 0 never retrieves (every tool rendered).
    uint32_t retrieval_k = 5;
    std::string tool_index_path;              // §9 index file; "" = embeddings made at create only
};

// Most tools a chat accepts (a documented cap [C]: every tool is embedded at create when
// retrieval is on; a longer list is refused before it is parsed).
constexpr size_t kMaxTools = 1024;  // NEEDLE_CHAT_MAX_TOOLS

// Figures of the last turn (needle_chat_stats).
struct TurnStats {
    uint32_t prefill_tokens = 0, generated_tokens = 0, call_tokens = 0;
    double prefill_ms = 0, decode_ms = 0, grammar_ms = 0;
    double p_decode = 0, p_head = -1;
};

// Positions the static prefix must leave free before max_seq_len (§10.3 [C]).
constexpr uint32_t kMinTurnRoom = 256;

class Chat {
public:
    // Parses and canonicalises the tools (§3.3), compiles the grammar, and with retrieval (§9)
    // embeds every tool (or reads the index file). Cheap checks come first, in linear time: the
    // tool count (kMaxTools), then whether the tools block can fit the context at all (with
    // retrieval: the retrieval_k largest tools), before any tokenising, grammar or embedding.
    // Throws Error: INVALID_ARGUMENT (bad JSON / UTF-8, not an array, a tool without a string
    // "name", more than kMaxTools tools, tool_choice required with no tool, a schema no value
    // satisfies: tool_checks.h), CONTEXT_FULL (static
    // prefix leaves fewer than kMinTurnRoom positions), UNSUPPORTED (no tokenizer / markers),
    // IO (the index file cannot be written), NO_MEMORY.
    Chat(std::shared_ptr<const Model> model, std::string_view system, std::string_view tools_json,
         const ChatOptions &opt);
    ~Chat();

    // The UTF-8 text the next complete(text) would feed (no BOS). Throws on invalid UTF-8.
    // With retrieval, a query turn's text selects the tools (an embedding pass, cached for the
    // next call with the same text); on a first turn the selection becomes the chat's (what
    // static_prefix_tokens() then reports); a follow-up query that changes it renders the new
    // static prefix, the transcript since the old one, then the turn (§10.3 [C]).
    // Throws CONTEXT_FULL when the selection's static prefix does not fit.
    std::string render(std::string_view text);
    // One turn; returns the envelope (§7). Application-level failures (invalid UTF-8, context
    // full, truncation, schema violation) are success:false envelopes, never exceptions.
    std::string complete(std::string_view text, uint32_t max_new_tokens);
    // Rewinds to the cached static prefix (§10.4); keeps tools and system.
    void reset();

    const std::string &tools_canonical() const { return tools_text_; }  // every declared tool
    // Declaration indices of the tools in the current static prefix (all of them without
    // retrieval; empty with retrieval before the first query turn or render).
    const std::vector<uint32_t> &selection() const { return selection_; }
    const ToolIndex *tool_index() const { return index_.get(); }  // null without retrieval
    const std::shared_ptr<const Grammar> &grammar() const { return grammar_; }  // the selection's
    uint32_t static_prefix_tokens() const { return uint32_t(prefix_ids_.size()); }  // BOS included
    const std::vector<uint32_t> &static_prefix_ids() const { return prefix_ids_; }
    const TurnStats &last_stats() const { return stats_; }

private:
    enum class Stop { Eos, Budget, Context, Internal };
    struct TurnResult {
        uint32_t generated = 0;
        double logp_call = 0.0;  // over the call tokens: after <tool_call> through </tool_call>
        uint32_t n_call = 0;
        double logp_all = 0.0;   // over every generated token (for a turn without a call)
        std::string payload;     // call bytes so far (the tool_choice required rule)
        std::string internal;    // an engine bug, reported as error_code "internal"
        double decode_s = 0.0;
        double grammar_s = 0.0;  // fill_mask + accept
    };

    void parse_tools(std::string_view tools_json);
    void check_fit(bool retrieve) const;  // the cheap CONTEXT_FULL checks of create (chat_select.cpp)
    std::string tools_block(const std::vector<uint32_t> &sel) const;  // "[" texts "," ... "]"
    // The selection's static prefix text and ids; CONTEXT_FULL when it leaves < kMinTurnRoom.
    void prefix_of(const std::vector<uint32_t> &sel, std::string &text, std::vector<uint32_t> &ids) const;
    std::vector<uint32_t> wanted_selection(std::string_view text);  // §9 for a query turn
    // Makes `sel` the current selection (prefix text and ids given by prefix_of): its grammar,
    // and the sequences when the sink count changes. Drops the prefix snapshot.
    void commit_selection(const std::vector<uint32_t> &sel, std::string text, std::vector<uint32_t> ids);
    std::string turn_text(std::string_view text) const;  // the turn's own text after the prefix
    void restore_prefix();  // the ONE place that rewinds to the static prefix (§10.4)
    void turn_ids(std::string_view text, std::vector<uint32_t> &out) const;
    bool is_tool_result_turn() const { return turns_ > 0 && last_had_calls_; }
    Stop decode(uint32_t max_new_tokens, TurnResult &r);
    uint32_t choose(int phase, bool forbid_empty_list, TurnResult &r);
    double head_probability() const;
    void finish_envelope(const TurnResult &r, Stop stop, Envelope &e);

    std::shared_ptr<const Model> model_;
    const Tokenizer *tok_ = nullptr;
    ChatOptions opt_;
    MarkerIds ids_;
    std::string system_;
    JsonValue tools_;                       // the parsed array
    std::vector<std::string> tool_texts_;   // each tool's canonical JSON (§3.3), declaration order
    std::vector<const JsonValue *> grammar_tools_;  // the selection's first definition of each name
    std::string tools_text_;                // canonical JSON of every declared tool (§3.3)
    std::unique_ptr<ToolIndex> index_;      // §9, null without retrieval
    std::vector<uint32_t> selection_;       // tools in the static prefix (declaration order)
    std::string sel_query_;                 // wanted_selection's cache: last text and its result
    std::vector<uint32_t> sel_result_;
    bool sel_cached_ = false;
    std::vector<uint32_t> transcript_;      // ids fed after the static prefix (§10.3 rebuild)
    std::string transcript_text_;           // ... and their text (render of a rebuild)
    std::string prefix_text_;               // static prefix text (§10.3)
    std::vector<uint32_t> prefix_ids_;      // BOS + encode(prefix_text_)
    std::unique_ptr<Sequence> seq_;
    std::unique_ptr<Sequence> prefix_seq_;  // seq_ right after the static prefix (§10.4)
    uint32_t seq_sinks_ = 0;                // sink_tokens the two sequences were made with
    bool have_snapshot_ = false;
    std::unique_ptr<Workspace> step_, batch_;
    bool at_prefix_ = false;                // seq_ holds exactly the static prefix
    uint32_t turns_ = 0;                    // completed turns since the prefix
    bool last_had_calls_ = false;
    std::string user_text_;                 // every turn's text since the prefix (§7.3 grounding)
    // Per-turn scratch, sized once here.
    std::vector<float> logits_;
    std::vector<uint64_t> mask_;
    std::vector<uint32_t> feed_ids_, gen_;
    TurnResult turn_;  // reused every turn (its payload keeps its capacity)
    TurnStats stats_;
    std::unique_ptr<TokenBytes> token_bytes_;
    GrammarOptions go_;
    std::shared_ptr<const Grammar> grammar_;  // compiled even with grammar off: post-decode checks
    std::unique_ptr<GrammarMatcher> matcher_;  // null with grammar off
};

// §8: min(head probability, decode probability), the head part skipped when absent (< 0).
// The ONE place that combines the two.
double combine_confidence(double p_head, double p_decode);

}  // namespace chat
}  // namespace needle
