// JSON parser and canonical writer (tool-calling.md §3.3); see json.h for the why.
#include "chat/json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "core/error.h"

namespace needle {
namespace chat {

const JsonValue *JsonValue::find(std::string_view key) const {
    for (const auto &m : members)
        if (m.first == key) return &m.second;
    return nullptr;
}

size_t count_array_items(std::string_view json) {
    size_t i = 0;
    while (i < json.size() && (json[i] == ' ' || json[i] == '\t' || json[i] == '\n' || json[i] == '\r')) ++i;
    if (i == json.size() || json[i] != '[') return 0;
    size_t depth = 0, commas = 0;
    bool in_string = false, content = false;
    for (; i < json.size(); ++i) {
        const char c = json[i];
        if (in_string) {
            if (c == '\\') ++i;  // the escaped byte cannot end the string
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '[' || c == '{') ++depth;
        else if ((c == ']' || c == '}') && depth > 0 && --depth == 0) break;
        else if (c == ',' && depth == 1) ++commas;
        if (depth >= 1 && c != ' ' && c != '\t' && c != '\n' && c != '\r' && !(depth == 1 && c == '[')) content = true;
    }
    return content ? commas + 1 : 0;
}

namespace {

[[noreturn]] void bad(size_t at, const char *what) {
    fail(NEEDLE_E_INVALID_ARGUMENT, strf("invalid JSON at byte %zu: %s", at, what));
}

// Appends code point cp as (generalized) UTF-8: surrogates get their 3-byte form.
void put_utf8(uint32_t cp, std::string &out) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// Decodes one UTF-8 sequence at s[i]; returns its length, 0 if invalid. Surrogate code points
// (ED A0..BF xx) are accepted only when `allow_surrogates` (our own lone-surrogate storage).
size_t utf8_next(std::string_view s, size_t i, uint32_t &cp, bool allow_surrogates) {
    const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
    const uint8_t c = b(0);
    if (c < 0x80) { cp = c; return 1; }
    size_t n;
    uint32_t min;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k) {
        if ((b(k) & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (b(k) & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF && !allow_surrogates) return 0;
    return n;
}

int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

class Parser {
public:
    Parser(std::string_view s, const JsonLimits &lim) : s_(s), lim_(lim) {}

    JsonValue run() {
        if (s_.size() > lim_.max_bytes)
            fail(NEEDLE_E_INVALID_ARGUMENT,
                 strf("JSON text of %zu bytes is over the %zu-byte limit", s_.size(), lim_.max_bytes));
        JsonValue result;
        for (;;) {
            JsonValue v;
            if (open_or_scalar(v)) continue;  // a container was opened: parse its first value
            if (finish(v, result)) break;     // top level complete
        }
        ws();
        if (i_ != s_.size()) bad(i_, "extra data after the top-level value");
        return result;
    }

private:
    struct Frame {
        JsonValue v;
        std::string key;                                        // Object: pending member key
        std::unique_ptr<std::unordered_map<std::string, size_t>> index;  // big objects only
    };
    std::string_view s_;
    const JsonLimits &lim_;
    size_t i_ = 0, values_ = 0;
    std::vector<Frame> stack_;

    void ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    }
    bool at(char c) { return i_ < s_.size() && s_[i_] == c; }
    bool lit(const char *w) {
        const size_t n = std::strlen(w);
        if (s_.substr(i_, n) != w) return false;
        i_ += n;
        return true;
    }
    void count() {
        if (++values_ > lim_.max_values)
            fail(NEEDLE_E_INVALID_ARGUMENT,
                 strf("JSON text has more than %zu values (limit) at byte %zu", lim_.max_values, i_));
    }

    // Parses a scalar into v (returns false), or opens a container (returns true; an empty
    // container is returned closed as a scalar would be).
    bool open_or_scalar(JsonValue &v) {
        ws();
        if (i_ >= s_.size()) bad(i_, "expected a value, got the end of the text");
        const char c = s_[i_];
        count();
        if (c == '[' || c == '{') {
            if (stack_.size() + 1 > lim_.max_depth)
                fail(NEEDLE_E_INVALID_ARGUMENT,
                     strf("JSON nested deeper than %u levels at byte %zu", lim_.max_depth, i_));
            ++i_;
            ws();
            const bool obj = c == '{';
            if (at(obj ? '}' : ']')) {
                ++i_;
                v.kind = obj ? JsonValue::Kind::Object : JsonValue::Kind::Array;
                return false;
            }
            stack_.emplace_back();
            stack_.back().v.kind = obj ? JsonValue::Kind::Object : JsonValue::Kind::Array;
            if (obj) key();
            return true;
        }
        scalar(v);
        return false;
    }

    // Object member key and ':' (whitespace before the key already skipped or skippable).
    void key() {
        ws();
        if (!at('"')) bad(i_, "expected a string key in double quotes");
        Frame &f = stack_.back();
        f.key.clear();
        string(f.key);
        ws();
        if (!at(':')) bad(i_, "expected ':' after an object key");
        ++i_;
    }

    // Adds the completed value v to the innermost container, closing containers as their
    // closing bracket follows. Returns true when the top-level value is complete (in result).
    bool finish(JsonValue &v, JsonValue &result) {
        for (;;) {
            if (stack_.empty()) {
                result = std::move(v);
                return true;
            }
            Frame &f = stack_.back();
            const bool obj = f.v.kind == JsonValue::Kind::Object;
            if (obj) add_member(f, std::move(v));
            else f.v.items.push_back(std::move(v));
            ws();
            if (at(',')) {
                ++i_;
                if (obj) key();
                return false;
            }
            if (!at(obj ? '}' : ']')) bad(i_, obj ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
            ++i_;
            v = std::move(f.v);
            stack_.pop_back();
        }
    }

    // Python dict semantics: a repeated key keeps its first position and takes the last value.
    static void add_member(Frame &f, JsonValue &&v) {
        auto &m = f.v.members;
        constexpr size_t kLinear = 16;
        if (!f.index && m.size() >= kLinear) {
            f.index = std::make_unique<std::unordered_map<std::string, size_t>>();
            for (size_t k = 0; k < m.size(); ++k) f.index->emplace(m[k].first, k);
        }
        if (f.index) {
            auto it = f.index->find(f.key);
            if (it != f.index->end()) {
                m[it->second].second = std::move(v);
                return;
            }
            f.index->emplace(f.key, m.size());
        } else {
            for (auto &p : m)
                if (p.first == f.key) {
                    p.second = std::move(v);
                    return;
                }
        }
        m.emplace_back(std::move(f.key), std::move(v));
        f.key = std::string();
    }

    void scalar(JsonValue &v) {
        const char c = s_[i_];
        if (c == '"') {
            v.kind = JsonValue::Kind::String;
            string(v.text);
        } else if (lit("null")) {
            v.kind = JsonValue::Kind::Null;
        } else if (lit("true")) {
            v.kind = JsonValue::Kind::True;
        } else if (lit("false")) {
            v.kind = JsonValue::Kind::False;
        } else if (lit("NaN")) {
            v.kind = JsonValue::Kind::Float, v.number = std::nan(""), v.text = "NaN";
        } else if (lit("Infinity")) {
            v.kind = JsonValue::Kind::Float, v.number = HUGE_VAL, v.text = "Infinity";
        } else if (lit("-Infinity")) {
            v.kind = JsonValue::Kind::Float, v.number = -HUGE_VAL, v.text = "-Infinity";
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            number(v);
        } else {
            bad(i_, "expected a value");
        }
    }

    size_t digits() {
        const size_t b = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
        return i_ - b;
    }

    // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? as Python's scanner: no fraction and no exponent
    // makes an int, anything else a float.
    void number(JsonValue &v) {
        const size_t start = i_;
        const bool neg = at('-');
        if (neg) ++i_;
        const size_t int_begin = i_;
        if (at('0')) ++i_;
        else if (digits() == 0) bad(i_, "expected digits in a number");
        const size_t int_end = i_;
        size_t frac_begin = i_, frac_end = i_;
        bool is_float = false;
        long long exp = 0;
        bool exp_huge = false;
        if (i_ + 1 < s_.size() && s_[i_] == '.' && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
            ++i_;
            frac_begin = i_;
            digits();
            frac_end = i_;
            is_float = true;
        }
        if (at('e') || at('E')) {
            size_t k = i_ + 1;
            bool eneg = false;
            if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) eneg = s_[k++] == '-';
            if (k < s_.size() && s_[k] >= '0' && s_[k] <= '9') {  // else: 'e' is extra data
                i_ = k;
                const size_t eb = i_;
                digits();
                for (size_t q = eb; q < i_; ++q) {
                    if (exp > 100000000) { exp_huge = true; break; }
                    exp = exp * 10 + (s_[q] - '0');
                }
                if (eneg) exp = -exp;
                is_float = true;
            }
        }
        const std::string_view text = s_.substr(start, i_ - start);
        if (!is_float) {
            v.kind = JsonValue::Kind::Int;
            const std::string_view mag = s_.substr(int_begin, int_end - int_begin);
            v.text = (neg && mag != "0") ? std::string(text) : std::string(mag);
            if (std::from_chars(text.data(), text.data() + text.size(), v.number).ec != std::errc())
                v.number = neg ? -HUGE_VAL : HUGE_VAL;
            return;
        }
        v.kind = JsonValue::Kind::Float;
        double d = 0;
        const auto r = std::from_chars(text.data(), text.data() + text.size(), d);
        if (r.ec == std::errc::result_out_of_range || exp_huge) {
            // Overflow -> inf, underflow -> signed zero: by the decimal order of magnitude.
            long long order = 0;
            bool nonzero = false;
            for (size_t q = int_begin; q < int_end; ++q)
                if (s_[q] != '0') { order = (long long)(int_end - q) - 1; nonzero = true; break; }
            if (!nonzero)
                for (size_t q = frac_begin; q < frac_end; ++q)
                    if (s_[q] != '0') { order = -(long long)(q - frac_begin) - 1; nonzero = true; break; }
            const bool up = nonzero && (exp_huge ? exp > 0 : order + exp > 0);
            d = up ? HUGE_VAL : 0.0;
            if (neg) d = -d;
        } else if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
            bad(start, "malformed number");
        }
        v.number = d;
        v.text = python_float_repr(d);
    }

    // A string literal at s_[i_] == '"', decoded into out (escapes resolved, UTF-8 checked).
    void string(std::string &out) {
        const size_t open = i_++;
        for (;;) {
            if (i_ >= s_.size()) bad(open, "unterminated string");
            const uint8_t c = uint8_t(s_[i_]);
            if (c == '"') { ++i_; return; }
            if (c < 0x20) bad(i_, "control character inside a string (escape it)");
            if (c == '\\') { escape(out); continue; }
            if (c < 0x80) { out += char(c); ++i_; continue; }
            uint32_t cp;
            const size_t n = utf8_next(s_, i_, cp, false);
            if (n == 0) bad(i_, "invalid UTF-8 in a string");
            out.append(s_.data() + i_, n);
            i_ += n;
        }
    }

    uint32_t hex4(size_t at) {
        if (at + 4 > s_.size()) bad(at, "truncated \\u escape");
        uint32_t u = 0;
        for (size_t k = 0; k < 4; ++k) {
            const int h = hex_val(s_[at + k]);
            if (h < 0) bad(at, "invalid \\u escape (four hex digits expected)");
            u = u << 4 | uint32_t(h);
        }
        return u;
    }

    void escape(std::string &out) {
        if (i_ + 1 >= s_.size()) bad(i_, "unterminated escape");
        const char e = s_[i_ + 1];
        i_ += 2;
        switch (e) {
            case '"': out += '"'; return;
            case '\\': out += '\\'; return;
            case '/': out += '/'; return;
            case 'b': out += '\b'; return;
            case 'f': out += '\f'; return;
            case 'n': out += '\n'; return;
            case 'r': out += '\r'; return;
            case 't': out += '\t'; return;
            case 'u': break;
            default: bad(i_ - 2, "invalid escape");
        }
        uint32_t u = hex4(i_);
        i_ += 4;
        // Python: a high surrogate directly followed by a \u low surrogate is one code point;
        // any other surrogate stays lone (kept in generalized UTF-8 for the writer).
        if (u >= 0xD800 && u <= 0xDBFF && i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            const uint32_t lo = hex4(i_ + 2);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                i_ += 6;
            }
        }
        put_utf8(u, out);
    }
};

void put_u4(uint32_t u, std::string &out) {
    static const char hex[] = "0123456789abcdef";
    out += "\\u";
    for (int sh = 12; sh >= 0; sh -= 4) out += hex[(u >> sh) & 0xF];
}

}  // namespace

JsonValue parse_json(std::string_view utf8, const JsonLimits &limits) {
    return Parser(utf8, limits).run();
}

std::string python_float_repr(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    // Shortest round-trip digits "[-]d[.ddd]e±XX": split into sign, digits, exponent.
    std::string_view t(buf, size_t(r.ptr - buf));
    std::string out;
    if (t[0] == '-') { out += '-'; t.remove_prefix(1); }
    const size_t epos = t.find('e');
    std::string dig;
    for (char c : t.substr(0, epos))
        if (c != '.') dig += c;
    int x = 0;
    std::from_chars(t.data() + epos + 1 + (t[epos + 1] == '+'), t.data() + t.size(), x);
    const int n = int(dig.size());
    if (x >= -4 && x < 16) {
        if (x < 0) {
            out += "0.";
            out.append(size_t(-x - 1), '0');
            out += dig;
        } else if (x + 1 >= n) {
            out += dig;
            out.append(size_t(x + 1 - n), '0');
            out += ".0";
        } else {
            out.append(dig, 0, size_t(x + 1));
            out += '.';
            out.append(dig, size_t(x + 1), std::string::npos);
        }
        return out;
    }
    out += dig[0];
    if (n > 1) {
        out += '.';
        out.append(dig, 1, std::string::npos);
    }
    out += x < 0 ? "e-" : "e+";
    const int ax = x < 0 ? -x : x;
    if (ax < 10) out += '0';
    out += std::to_string(ax);
    return out;
}

void write_canonical_string(std::string_view s, std::string &out) {
    out += '"';
    for (size_t i = 0; i < s.size();) {
        const uint8_t c = uint8_t(s[i]);
        if (c >= 0x20 && c < 0x7F) {
            if (c == '"' || c == '\\') out += '\\';
            out += char(c);
            ++i;
            continue;
        }
        switch (c) {
            case '\n': out += "\\n"; ++i; continue;
            case '\r': out += "\\r"; ++i; continue;
            case '\t': out += "\\t"; ++i; continue;
            case '\b': out += "\\b"; ++i; continue;
            case '\f': out += "\\f"; ++i; continue;
            default: break;
        }
        uint32_t cp;
        size_t n = utf8_next(s, i, cp, true);
        if (n == 0) { cp = 0xFFFD; n = 1; }
        i += n;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            put_u4(0xD800 + (cp >> 10), out);
            put_u4(0xDC00 + (cp & 0x3FF), out);
        } else {
            put_u4(cp, out);
        }
    }
    out += '"';
}

void write_canonical(const JsonValue &root, std::string &out, bool strict_json) {
    // Explicit stack of (container, next child index): no recursion whatever the depth.
    std::vector<std::pair<const JsonValue *, size_t>> stack;
    const JsonValue *v = &root;
    for (;;) {
        if (v) {
            switch (v->kind) {
                case JsonValue::Kind::Null: out += "null"; break;
                case JsonValue::Kind::False: out += "false"; break;
                case JsonValue::Kind::True: out += "true"; break;
                case JsonValue::Kind::Int: out += v->text; break;
                case JsonValue::Kind::Float:
                    out += strict_json && !std::isfinite(v->number) ? "null" : v->text;
                    break;
                case JsonValue::Kind::String: write_canonical_string(v->text, out); break;
                case JsonValue::Kind::Array: out += '['; stack.emplace_back(v, 0); break;
                case JsonValue::Kind::Object: out += '{'; stack.emplace_back(v, 0); break;
            }
        }
        if (stack.empty()) return;
        auto &[c, k] = stack.back();
        const bool obj = c->kind == JsonValue::Kind::Object;
        const size_t n = obj ? c->members.size() : c->items.size();
        if (k == n) {
            out += obj ? '}' : ']';
            stack.pop_back();
            v = nullptr;
            continue;
        }
        if (k) out += ',';
        if (obj) {
            write_canonical_string(c->members[k].first, out);
            out += ':';
            v = &c->members[k].second;
        } else {
            v = &c->items[k];
        }
        ++k;
    }
}

bool has_non_finite(const JsonValue &root) {
    std::vector<const JsonValue *> todo{&root};
    while (!todo.empty()) {
        const JsonValue *v = todo.back();
        todo.pop_back();
        if (v->kind == JsonValue::Kind::Float && !std::isfinite(v->number)) return true;
        for (const JsonValue &item : v->items) todo.push_back(&item);
        for (const auto &member : v->members) todo.push_back(&member.second);
    }
    return false;
}

}  // namespace chat
}  // namespace needle
