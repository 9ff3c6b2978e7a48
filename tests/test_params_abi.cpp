// The params-struct ABI of include/needle.h: every needle_*_params_init writes only the bytes the
// caller's struct_size covers (whole fields), so a program built against an older, shorter struct
// never has a newer library write past it; a struct_size below the first layout writes nothing.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "needle.h"

namespace {

constexpr unsigned char kSentinel = 0xA5;

#define FIELD_END(T, f) (offsetof(T, f) + sizeof(static_cast<T *>(nullptr)->f))

// For each struct_size from 0 to sizeof(T) + 8: a sentinel-filled buffer whose first bytes are a
// T with that struct_size goes through init. Expected: struct_size unchanged; the fields that
// end within struct_size hold the defaults (those of a full-size init) when struct_size reaches
// the first layout (`ends[0]`); every other byte, and everything past struct_size, untouched.
template <class T>
void check_init(void (*init)(T *), std::vector<size_t> ends) {
    T full;
    full.struct_size = sizeof full;
    init(&full);
    const auto *def = reinterpret_cast<const unsigned char *>(&full);
    for (uint32_t size = 0; size <= sizeof(T) + 8; ++size) {
        CAPTURE(size);
        std::vector<unsigned char> buf(sizeof(T) + 16, kSentinel);
        std::memcpy(buf.data(), &size, sizeof size);
        init(reinterpret_cast<T *>(buf.data()));
        size_t whole = 0;  // bytes of the fields that lie wholly within `size`
        if (size >= ends[0])
            for (size_t e : ends)
                if (e <= size && e > whole) whole = e;
        uint32_t got_size;
        std::memcpy(&got_size, buf.data(), sizeof got_size);
        CHECK(got_size == size);
        size_t bad = 0;
        for (size_t i = sizeof(uint32_t); i < buf.size(); ++i) {
            const unsigned char want = i < whole ? def[i] : kSentinel;
            if (buf[i] != want && bad++ == 0) CHECK_MESSAGE(false, "byte " << i << " is " << int(buf[i]));
        }
        CHECK(bad == 0);
    }
}

}  // namespace

TEST_CASE("api: params_init writes only the caller's struct_size bytes") {
    SUBCASE("model: first layout ends after n_threads, depth and precision appended") {
        check_init<needle_model_params>(needle_model_params_init, {FIELD_END(needle_model_params, n_threads),
                                                                   FIELD_END(needle_model_params, depth),
                                                                   FIELD_END(needle_model_params, precision)});
        // Spot values: a first-layout caller gets use_mmap 1 and n_threads 0, nothing more.
        std::vector<unsigned char> buf(sizeof(needle_model_params) + 8, kSentinel);
        auto *p = reinterpret_cast<needle_model_params *>(buf.data());
        p->struct_size = 12;
        needle_model_params_init(p);
        CHECK(p->use_mmap == 1);
        CHECK(p->n_threads == 0);
        CHECK(buf[12] == kSentinel);
        p->struct_size = 11;  // too small: nothing written
        p->use_mmap = 7;
        needle_model_params_init(p);
        CHECK(p->use_mmap == 7);
    }
    SUBCASE("state: first layout ends after kv_window, kv_type, max_tokens and probe_heads appended") {
        check_init<needle_state_params>(needle_state_params_init,
                                        {FIELD_END(needle_state_params, kv_window), FIELD_END(needle_state_params, kv_type),
                                         FIELD_END(needle_state_params, max_tokens),
                                         FIELD_END(needle_state_params, probe_heads)});
        needle_state_params sp;
        sp.struct_size = 8;
        sp.kv_type = 99, sp.max_tokens = 99;
        needle_state_params_init(&sp);
        CHECK(sp.kv_window == -1);
        CHECK(sp.kv_type == 99);
        CHECK(sp.max_tokens == 99u);
    }
    SUBCASE("generate: one layout, all or nothing") {
        check_init<needle_generate_params>(needle_generate_params_init, {sizeof(needle_generate_params)});
        needle_generate_params gp;
        gp.struct_size = sizeof gp;
        needle_generate_params_init(&gp);
        CHECK(gp.max_tokens == 128u);
        CHECK(gp.top_p == 1.0f);
        CHECK(gp.add_bos == 1);
    }
    SUBCASE("chat: first layout ends after stop_needs_call, sinks, validation and tool_index_path appended") {
        check_init<needle_chat_params>(needle_chat_params_init, {FIELD_END(needle_chat_params, stop_needs_call),
                                                                 FIELD_END(needle_chat_params, sinks),
                                                                 FIELD_END(needle_chat_params, validation),
                                                                 FIELD_END(needle_chat_params, tool_index_path)});
        needle_chat_params cp;
        cp.struct_size = sizeof cp;
        needle_chat_params_init(&cp);
        CHECK(cp.grammar == 1);
        CHECK(cp.sinks == 1);
        CHECK(cp.validation == NEEDLE_VALIDATION_OFF);
        CHECK(cp.tool_index_path == nullptr);
    }
}
