// Shared checks of the libFuzzer targets (scripts/fuzz.sh builds them with ASan + UBSan).
// A broken invariant calls fuzz_fail(), which aborts: libFuzzer records the input as a crash.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "needle.h"
#include "tokenizer/tokenizer.h"

#define fuzz_fail(...)                                                  \
    do {                                                                \
        std::fprintf(stderr, "fuzz invariant broken: " __VA_ARGS__);    \
        std::fprintf(stderr, " [%s:%d]\n", __FILE__, __LINE__);         \
        std::abort();                                                   \
    } while (0)

inline bool fuzz_all_finite(const float *v, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!std::isfinite(v[i])) return false;
    return true;
}

// A failing call must give a status from `allowed` plus a non-empty message.
inline void fuzz_expect_refusal(needle_status st, std::initializer_list<needle_status> allowed, const char *what) {
    bool ok = false;
    for (needle_status a : allowed) ok = ok || st == a;
    if (!ok) fuzz_fail("%s returned %d (%s): %s", what, st, needle_status_string(st), needle_last_error());
    if (needle_last_error()[0] == '\0') fuzz_fail("%s failed with an empty message", what);
}

inline bool fuzz_utf8(const char *s, size_t n) { return needle::utf8_valid(std::string_view(s, n)); }
