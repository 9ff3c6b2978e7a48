// Upstream's process-wide calls (src/capi/upstream_api.cpp): argument errors report the value
// the caller passed.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "needle.h"

namespace {
std::string complete_error(const char *text, int max_new_tokens, char *out, int size, int *rc) {
    *rc = needle_complete(text, max_new_tokens, out, size);
    return needle_last_error();
}
}  // namespace

TEST_CASE("upstream api: needle_complete argument errors name the parameter and the bad value") {
    char buf[64] = "untouched";
    int rc = 0;
    CHECK(complete_error("hi", 16, buf, -1, &rc) ==
          "needle_complete: out_buf_size -1 (need at least 2 bytes: the envelope and its NUL)");
    CHECK(rc == -int(NEEDLE_E_INVALID_ARGUMENT));
    CHECK(complete_error("hi", 16, buf, 1, &rc) ==
          "needle_complete: out_buf_size 1 (need at least 2 bytes: the envelope and its NUL)");
    CHECK(buf[0] == '\0');  // size 1: the empty string
    CHECK(complete_error("hi", -5, buf, int(sizeof buf), &rc) == "needle_complete: max_new_tokens -5 (must be >= 1)");
    CHECK(rc == -int(NEEDLE_E_INVALID_ARGUMENT));
    CHECK(complete_error("hi", 0, buf, int(sizeof buf), &rc) == "needle_complete: max_new_tokens 0 (must be >= 1)");
    CHECK(complete_error(nullptr, 16, buf, int(sizeof buf), &rc) == "needle_complete: text is NULL");
    CHECK(complete_error("hi", 16, nullptr, 64, &rc) == "needle_complete: out_buf is NULL");
    CHECK(rc == -int(NEEDLE_E_INVALID_ARGUMENT));
}

TEST_CASE("upstream api: a NEEDLE_MODEL that fails to load is named with its path") {
    // The caller of needle_init passed no path: the message says where it came from. (Each ctest
    // entry is its own process, so the process-wide model of the other cases is not touched.)
    REQUIRE(setenv("NEEDLE_MODEL", "/nonexistent/model.cact", 1) == 0);
    const int rc = needle_init("", "[]", nullptr);
    const std::string msg = needle_last_error();
    unsetenv("NEEDLE_MODEL");
    CHECK(rc == -int(NEEDLE_E_IO));
    INFO(msg);
    CHECK(msg.rfind("needle_init: NEEDLE_MODEL=/nonexistent/model.cact: cannot open", 0) == 0);
}
