// Shared helpers of the chat tests: a chat handle owner, creation with a status check, and a
// turn's envelope text.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api_util.h"
#include "needle.h"

namespace chat_test {

struct ChatDel {
    void operator()(needle_chat *c) const { needle_chat_free(c); }
};
using Chat = std::unique_ptr<needle_chat, ChatDel>;

inline needle_model *tiny() {  // the v2 fixture model "tiny" (random weights, tok tokenizer)
    static api_test::Model m = api_test::load(api_test::model_path("tiny"));
    return m.get();
}

inline needle_chat_params params(int32_t tool_choice = NEEDLE_TOOL_CHOICE_AUTO) {
    needle_chat_params p;
    p.struct_size = sizeof p;
    needle_chat_params_init(&p);
    p.tool_choice = tool_choice;
    return p;
}

// Creates a chat; status and message of a failure are returned through st / msg.
inline Chat try_chat(needle_model *m, const std::string &tools, const needle_chat_params &p, needle_status &st,
                     std::string &msg) {
    needle_chat *c = nullptr;
    st = needle_chat_create(m, "", tools.c_str(), &p, &c);
    msg = st == NEEDLE_OK ? "" : needle_last_error();
    return Chat(c);
}

inline Chat make_chat(needle_model *m, const std::string &tools, const needle_chat_params &p) {
    needle_status st;
    std::string msg;
    Chat c = try_chat(m, tools, p, st, msg);
    INFO("needle_chat_create: " << msg);
    REQUIRE(st == NEEDLE_OK);
    return c;
}

inline std::string complete_text(needle_chat *c, const std::string &text, uint32_t max_new_tokens) {
    std::vector<char> buf(65536, 'x');
    size_t len = 0;
    const needle_status st = needle_chat_complete(c, text.c_str(), max_new_tokens, buf.data(), buf.size(), &len);
    INFO("needle_chat_complete: " << needle_last_error());
    REQUIRE(st == NEEDLE_OK);
    REQUIRE(len == std::strlen(buf.data()));
    return std::string(buf.data(), len);
}

}  // namespace chat_test
