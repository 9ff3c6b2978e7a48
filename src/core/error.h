// Internal error type. Engine code throws needle::Error; the C shim (src/capi) catches every
// exception at the ABI and turns it into a status plus the thread's last-error message.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "needle.h"

namespace needle {

class Error : public std::runtime_error {
public:
    Error(needle_status code, std::string message)
        : std::runtime_error(std::move(message)), code_(code) {}
    needle_status code() const noexcept { return code_; }

private:
    needle_status code_;
};

// printf-style message formatting for error paths only (allocates).
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string strf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// "" for a count of one, else "s": messages say "1 token" and "2 tokens" (use as "%llu byte%s").
inline const char *plural(unsigned long long n) { return n == 1 ? "" : "s"; }

[[noreturn]] inline void fail(needle_status code, std::string message) {
    throw Error(code, std::move(message));
}

}  // namespace needle
