#include "chat/envelope.h"

#include <cmath>
#include <cstdio>

#include <sys/resource.h>

namespace needle {
namespace chat {

const char kTruncatedMessage[] = "tool call truncated: token budget exhausted";

void write_json_string_raw(const std::string &s, std::string &out) {
    out += '"';
    for (char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += ch;
            }
        }
    }
    out += '"';
}

namespace {
void field(std::string &out, const char *key) {
    if (out.size() > 1) out += ',';
    out += '"';
    out += key;
    out += "\":";
}
void string_or_null(std::string &out, const char *key, const std::string &v) {
    field(out, key);
    if (v.empty()) out += "null";
    else write_json_string_raw(v, out);
}
// A number rounded to `decimals`, written in its shortest form with at least one fractional
// digit (0.9468, 0.9, 4300.0). Non-finite values become 0.0 (JSON has no NaN).
void number(std::string &out, const char *key, double v, int decimals) {
    field(out, key);
    if (!std::isfinite(v)) v = 0.0;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    std::string s(buf);
    while (s.size() > 2 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
    if (s == "-0.0") s = "0.0";
    out += s;
}
}  // namespace

std::string write_envelope(const Envelope &e) {
    std::string out = "{";
    out.reserve(256 + e.function_calls.size() + e.suppressed_calls.size() + e.reasoning.size() + e.validation.size());
    field(out, "type");
    out += e.respond ? "\"respond\"" : "\"call\"";
    field(out, "success");
    out += e.success ? "true" : "false";
    string_or_null(out, "error", e.error);
    string_or_null(out, "error_code", e.error_code);
    string_or_null(out, "reason", e.reason);
    field(out, "function_calls");
    out += e.function_calls;
    field(out, "suppressed_calls");
    out += e.suppressed_calls;
    field(out, "reasoning");
    write_json_string_raw(e.reasoning, out);
    number(out, "confidence", e.confidence, 4);
    number(out, "prefill_tps", e.prefill_tps, 1);
    number(out, "decode_tps", e.decode_tps, 1);
    number(out, "peak_ram_mb", e.peak_ram_mb, 1);
    if (!e.validation.empty()) {
        field(out, "validation");
        out += e.validation;
    }
    out += '}';
    return out;
}

void set_failure(Envelope &e, const char *code, std::string message) {
    e.success = false;
    e.respond = false;
    e.error_code = code;
    e.error = std::move(message);
    e.reason = "runtime_failure";
}

std::string buffer_too_small_envelope(size_t needed) {
    Envelope e;
    (void)needed;  // reported through the length out-parameter and needle_last_error()
    set_failure(e, "buffer_too_small", "buffer too small");  // short: it must fit where the real one did not
    return write_envelope(e);
}

double peak_rss_mib() {
    struct rusage ru {};
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return double(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

}  // namespace chat
}  // namespace needle
