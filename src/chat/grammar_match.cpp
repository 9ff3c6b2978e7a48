// Token byte strings, their tries, and the grammar matcher (tool-calling.md §6.3-§6.5).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "chat/grammar.h"
#include "core/error.h"

namespace needle {
namespace chat {

using namespace gram;

// ---------------------------------------------------------------- token bytes and tries

namespace {

// Code points of s if it is plain string content (complete UTF-8, no '"', '\\', byte < 0x20),
// else -1.
int plain_code_points(std::string_view s) {
    int n = 0;
    for (size_t i = 0; i < s.size(); ++n) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\') return -1;
            ++i;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return -1;
        if (i + len > s.size()) return -1;
        for (size_t k = 1; k < len; ++k) {
            const uint8_t b = uint8_t(s[i + k]);
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return -1;
        }
        i += len;
    }
    return n;
}

void build_trie(const std::vector<std::string> &bytes, std::vector<uint32_t> ids, TokenBytes::Trie &t) {
    std::sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) { return bytes[a] < bytes[b] || (bytes[a] == bytes[b] && a < b); });
    // Insert in sorted order: a node's children are created in increasing byte order, and an
    // existing child is always the last one created.
    std::vector<std::vector<std::pair<uint8_t, uint32_t>>> kids(1);
    std::vector<std::vector<uint32_t>> ends(1);
    for (uint32_t id : ids) {
        uint32_t n = 0;
        for (char ch : bytes[id]) {
            const uint8_t b = uint8_t(ch);
            if (kids[n].empty() || kids[n].back().first != b) {
                kids[n].emplace_back(b, uint32_t(kids.size()));
                kids.emplace_back();
                ends.emplace_back();
            }
            n = kids[n].back().second;
        }
        ends[n].push_back(id);
        t.max_depth = std::max<uint32_t>(t.max_depth, uint32_t(bytes[id].size()));
    }
    t.nodes.resize(kids.size());
    for (size_t n = 0; n < kids.size(); ++n) {
        auto &node = t.nodes[n];
        node.child_begin = uint32_t(t.child_byte.size());
        for (auto &[b, c] : kids[n]) t.child_byte.push_back(b), t.child_node.push_back(c);
        node.child_end = uint32_t(t.child_byte.size());
        node.tok_begin = uint32_t(t.tokens.size());
        t.tokens.insert(t.tokens.end(), ends[n].begin(), ends[n].end());
        node.tok_end = uint32_t(t.tokens.size());
    }
}

}  // namespace

TokenBytes::TokenBytes(const Tokenizer &tok) {
    const uint32_t V = tok.size();
    bytes_.resize(V);
    marker_.resize(V);
    words_ = (V + 63) / 64;
    plain_.assign(size_t(kPlainMax + 1) * words_, 0);
    std::vector<uint32_t> all, special;
    for (uint32_t id = 0; id < V; ++id) {
        const PieceType ty = tok.type(id);
        marker_[id] = ty == PieceType::Control || ty == PieceType::Unknown || ty == PieceType::UserDefined;
        if (ty == PieceType::Byte || ty == PieceType::Normal || ty == PieceType::UserDefined) {
            // U+2581 (E2 96 81) is a space (§6.5).
            const std::string_view raw = tok.token_bytes(id);
            std::string &b = bytes_[id];
            for (size_t i = 0; i < raw.size(); ++i) {
                if (raw.compare(i, 3, "\xE2\x96\x81") == 0) b += ' ', i += 2;
                else b += raw[i];
            }
        }
        if (marker_[id] || bytes_[id].empty()) continue;
        all.push_back(id);
        const int cps = plain_code_points(bytes_[id]);
        if (cps < 1 || cps > int(kPlainMax)) {
            special.push_back(id);
            continue;
        }
        for (uint32_t n = uint32_t(cps); n <= kPlainMax; ++n) plain_[size_t(n) * words_ + id / 64] |= uint64_t(1) << (id % 64);
    }
    const int64_t ec = tok.find("</tool_call>");
    if (ec >= 0 && marker_[size_t(ec)]) end_call_ = ec;
    build_trie(bytes_, std::move(all), full_);
    build_trie(bytes_, std::move(special), special_);
}

// ---------------------------------------------------------------- the automaton

namespace {

struct Frame {
    uint32_t node;
    uint8_t phase, flags;  // flags: LitSet 1 = key mode (skip seen slots); Number 1 = negative
    uint16_t k;            // LitSet: bytes matched; String: UTF-8 bytes left / hex digit; Number: digits
    uint32_t a, b;         // LitSet: candidate range; String: code points, scratch; Number: a = fraction digits
    uint64_t bits;         // Object: seen slots (LitSet key mode: the same); Number: digits as an integer
};

}  // namespace

struct GrammarMatcher::State {
    uint32_t depth;
    uint32_t result;  // payload of the last completed literal
    bool complete;
    Frame f[kMaxFrames];
};

namespace {

using State = GrammarMatcher::State;
enum R { kConsumed, kDone, kReject, kPass, kRetry };

void copy_state(State &dst, const State &src) {
    dst.depth = src.depth;
    dst.result = src.result;
    dst.complete = src.complete;
    std::memcpy(dst.f, src.f, sizeof(Frame) * src.depth);
}

void init_frame(const Grammar &g, Frame &f, uint32_t node, uint8_t flags, uint64_t bits) {
    f = Frame{node, 0, flags, 0, 0, 0, bits};
    const Node &n = g.nodes_[node];
    if (n.kind == Kind::LitSet) f.a = n.lit_begin, f.b = n.lit_end;
}

bool push(const Grammar &g, State &s, uint32_t node, uint8_t flags = 0, uint64_t bits = 0) {
    if (s.depth >= kMaxFrames) return false;
    init_frame(g, s.f[s.depth++], node, flags, bits);
    return true;
}

R feed_litset(const Grammar &g, State &s, Frame &f, uint8_t c) {
    const auto &L = g.lits_;
    const size_t p = f.k;
    const bool key = f.flags & 1;
    if (f.a >= f.b) return kReject;  // an empty set (empty enum, no tools)
    uint32_t lo = f.a, hi;
    if (L[lo].bytes.size() == p) ++lo;  // the (only) candidate complete at p sorts first
    const auto at = [&](uint32_t i) { return uint8_t(L[i].bytes[p]); };
    while (lo < f.b && at(lo) < c) ++lo;  // candidates are few; a linear scan beats a search
    hi = lo;
    while (hi < f.b && at(hi) == c) ++hi;
    bool any = lo < hi;
    if (any && key) {
        any = false;
        for (uint32_t i = lo; i < hi && !any; ++i) any = !((f.bits >> L[i].payload) & 1);
    }
    if (any) {
        f.a = lo, f.b = hi, f.k = uint16_t(p + 1);
        if (hi - lo == 1 && L[lo].bytes.size() == p + 1) {
            s.result = L[lo].payload;
            return kDone;
        }
        return kConsumed;
    }
    if (L[f.a].bytes.size() == p && !(key && ((f.bits >> L[f.a].payload) & 1))) {
        s.result = L[f.a].payload;
        return kPass;
    }
    return kReject;
}

int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Pattern automaton of a string frame: state in bits[0..16), a partial code point in bits[32..64).
uint16_t dfa_q(const Frame &f) { return uint16_t(f.bits & 0xFFFF); }
uint32_t partial(const Frame &f) { return uint32_t(f.bits >> 32); }
void set_partial(Frame &f, uint32_t cp) { f.bits = (f.bits & 0xFFFF) | uint64_t(cp) << 32; }
// Some code point in [lo, hi] keeps the pattern (and maxLength) satisfiable.
bool cp_range_ok(const Node &n, const PatternDfa *d, const Frame &f, uint32_t lo, uint32_t hi) {
    return !d || d->any_live(dfa_q(f), lo, hi, n.max_count - f.a);
}
// A complete code point: count it and move the pattern automaton.
R take_cp(const Node &n, const PatternDfa *d, Frame &f, uint32_t cp) {
    if (d) {
        if (!cp_range_ok(n, d, f, cp, cp)) return kReject;
        f.bits = d->next[size_t(dfa_q(f)) * d->classes() + d->class_of(cp)];
    }
    ++f.a, f.phase = 1;
    return kConsumed;
}
// BMP escapes \uXXXX with a pattern: [lo, hi] minus the surrogates (none allowed there).
bool bmp_ok(const Node &n, const PatternDfa *d, const Frame &f, uint32_t lo, uint32_t hi) {
    return cp_range_ok(n, d, f, lo, std::min<uint32_t>(hi, 0xD7FF)) || cp_range_ok(n, d, f, std::max<uint32_t>(lo, 0xE000), hi);
}

R feed_string(const Node &n, const PatternDfa *d, Frame &f, uint8_t c) {
    switch (f.phase) {
        case 0:
            if (c != '"') return kReject;
            f.phase = 1;
            f.bits = d ? d->start : 0;
            return kConsumed;
        case 1:
            if (c == '"') return f.a >= n.min_count && (!d || d->accept[dfa_q(f)]) ? kDone : kReject;
            if (f.a >= n.max_count || c < 0x20) return kReject;
            if (c == '\\') {
                if (!bmp_ok(n, d, f, 0, 0xFFFF)) return kReject;
                f.phase = 2;
                return kConsumed;
            }
            if (c < 0x80) return take_cp(n, d, f, c);
            {
                uint32_t lo = 0x80, hi = 0xBF, cp;
                if (c >= 0xC2 && c <= 0xDF) f.k = 1, cp = c & 0x1F;
                else if (c >= 0xE0 && c <= 0xEF) f.k = 2, cp = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
                else if (c >= 0xF0 && c <= 0xF4) f.k = 3, cp = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
                else return kReject;
                const uint32_t sh = 6 * f.k;
                if (d && !cp_range_ok(n, d, f, std::max(cp << sh | (lo & 0x3F) << (sh - 6), uint32_t(f.k == 1 ? 0x80 : f.k == 2 ? 0x800 : 0x10000)),
                                      std::min((cp << sh | (hi & 0x3F) << (sh - 6)) + (1u << (sh - 6)) - 1, 0x10FFFFu)))
                    return kReject;
                f.b = lo | hi << 8;
                set_partial(f, cp);
                f.phase = 7;
                return kConsumed;
            }
        case 7: {  // UTF-8 continuation bytes (validated byte by byte, §6.5)
            if (c < (f.b & 0xFF) || c > (f.b >> 8)) return kReject;
            const uint32_t cp = partial(f) << 6 | (c & 0x3F);
            if (f.k == 1) return take_cp(n, d, f, cp);
            const uint32_t sh = 6 * (f.k - 1u);
            if (d && !cp_range_ok(n, d, f, cp << sh, (cp << sh) + (1u << sh) - 1)) return kReject;
            f.b = 0x80 | 0xBF << 8;
            set_partial(f, cp);
            --f.k;
            return kConsumed;
        }
        case 2: {
            if (c == 'u') { f.phase = 3, f.k = 0, f.b = 0; return kConsumed; }
            static const char esc[] = "\"\\/bfnrt";
            static const uint8_t val[] = {'"', '\\', '/', 8, 12, 10, 13, 9};
            const char *e = c ? std::strchr(esc, c) : nullptr;
            if (!e) return kReject;
            return take_cp(n, d, f, val[e - esc]);
        }
        case 3: {  // \uXXXX; [C] a low surrogate must follow a high one (no lone surrogates)
            const int h = hexval(c);
            if (h < 0) return kReject;
            const uint32_t v = f.b << 4 | uint32_t(h), rest = 4 * (3u - f.k);
            if (d) {  // with a pattern: BMP only, each digit keeps some code point alive
                if (!bmp_ok(n, d, f, v << rest, (v << rest) + (1u << rest) - 1)) return kReject;
            } else if (f.k == 1 && f.b == 0xD && h >= 0xC) {
                return kReject;
            }
            f.b = v;
            if (++f.k < 4) return kConsumed;
            if (f.b >= 0xD800 && f.b <= 0xDBFF) { f.phase = 4; return kConsumed; }
            return take_cp(n, d, f, f.b);
        }
        case 4:
            if (c != '\\') return kReject;
            f.phase = 5;
            return kConsumed;
        case 5:
            if (c != 'u') return kReject;
            f.phase = 6, f.k = 0;
            return kConsumed;
        case 6: {
            const int h = hexval(c);
            if (h < 0 || (f.k == 0 && h != 0xD) || (f.k == 1 && h < 0xC)) return kReject;
            if (++f.k == 4) ++f.a, f.phase = 1;
            return kConsumed;
        }
    }
    return kReject;
}

const double kPow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                         1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

bool in_range(const Node &n, double x) {
    return (n.lo_inc ? x >= n.lo : x > n.lo) && (n.hi_inc ? x <= n.hi : x < n.hi);
}
// Can the number prefix in f still be completed to a value in the node's range (§6.4 pruning)?
// Exact, not dense: a bounded number has at most kBoundedDigits digits, so a prefix whose cell
// [v, v + 1) meets the range only between the values its remaining digits can write (range
// (12345678901234.95, 12345678901300] after "12345678901234.") is a dead end the mask must not
// offer. Each (more integer digits s, fraction digits e) gives a grid of values tested exactly.
bool viable(const Node &n, const Frame &f) {
    const bool neg = f.flags & 1;
    const uint32_t left = kBoundedDigits - f.k;  // digits still writable
    const double v = double(f.bits);
    // The values (v * 10^t + [0, 10^t)) / 10^frac.
    const auto cell = [&](double base, uint32_t t, uint32_t frac) {
        return gram::grid_hit(n, base * kPow10[t], (base + 1) * kPow10[t] - 1, frac, neg);
    };
    switch (f.phase) {
        case 1:  // "-": some negative value of up to kBoundedDigits digits
            for (uint32_t e = 0; e <= (n.integer ? 0 : kBoundedDigits - 1); ++e)
                if (gram::grid_hit(n, 0, kPow10[kBoundedDigits] - 1, e, true)) return true;
            return false;
        case 2:  // integer digits: s more of them, then optionally '.' and e fraction digits
            for (uint32_t s = 0; s <= left; ++s)
                for (uint32_t e = 0; e <= (n.integer ? 0 : left - s); ++e)
                    if (cell(v, s + e, e)) return true;
            return false;
        case 3:  // a leading "0": 0 itself or "0." and e fraction digits
            for (uint32_t e = 0; e <= (n.integer ? 0 : left); ++e)
                if (cell(0, e, e)) return true;
            return false;
        case 4:  // "v.": at least one fraction digit follows
            for (uint32_t e = 1; e <= left; ++e)
                if (cell(v, e, e)) return true;
            return false;
        case 5:  // "v.ddd": f.a fraction digits so far, e more
            for (uint32_t e = 0; e <= left; ++e)
                if (cell(v, e, f.a + e)) return true;
            return false;
    }
    return true;
}

R number_end(const Node &n, const Frame &f) {
    if (f.phase != 2 && f.phase != 3 && f.phase != 5 && f.phase != 8) return kReject;
    if (!n.bounded) return kPass;
    const double v = double(f.bits) / (f.phase == 5 ? kPow10[f.a] : 1.0);
    return in_range(n, (f.flags & 1) ? -v : v) ? kPass : kReject;
}

R feed_number(const Node &n, Frame &f, uint8_t c) {
    const bool digit = c >= '0' && c <= '9';
    const uint32_t d = c - '0';
    const auto add_digit = [&](uint8_t phase) {
        if (n.bounded) {
            if (f.k >= kBoundedDigits) return kReject;
            f.bits = f.bits * 10 + d;
        }
        ++f.k;
        if (phase == 5) ++f.a;
        f.phase = phase;
        return !n.bounded || viable(n, f) ? kConsumed : kReject;
    };
    switch (f.phase) {
        case 0:
            if (c == '-') {
                f.flags |= 1, f.phase = 1;
                return !n.bounded || viable(n, f) ? kConsumed : kReject;
            }
            [[fallthrough]];
        case 1:
            if (!digit) return kReject;
            return add_digit(d == 0 ? 3 : 2);
        case 2:
        case 3:
        case 5:
            if (digit && f.phase != 3) return add_digit(f.phase);
            if (c == '.' && f.phase != 5 && !n.integer) {
                if (n.bounded && f.k >= kBoundedDigits) return kReject;
                f.phase = 4;
                return !n.bounded || viable(n, f) ? kConsumed : kReject;
            }
            if ((c == 'e' || c == 'E') && !n.integer && !n.bounded) { f.phase = 6; return kConsumed; }
            return number_end(n, f);
        case 4:
            return digit ? add_digit(5) : kReject;
        case 6:
            if (c == '+' || c == '-') { f.phase = 7; return kConsumed; }
            [[fallthrough]];
        case 7:
            if (!digit) return kReject;
            f.phase = 8;
            return kConsumed;
        case 8:
            return digit ? kConsumed : number_end(n, f);
    }
    return kReject;
}

int first_byte_class(uint8_t c) {
    switch (c) {
        case '"': return kStr;
        case '{': return kObj;
        case '[': return kArr;
        case 't': case 'f': return kBool;
        case 'n': return kNull;
        default: return c == '-' || (c >= '0' && c <= '9') ? kNum : -1;
    }
}

R feed(const Grammar &g, State &s, Frame &f, uint8_t c) {
    const Node &n = g.nodes_[f.node];
    const uint64_t all = n.props.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.props.size()) - 1;
    switch (n.kind) {
        case Kind::LitSet: return feed_litset(g, s, f, c);
        case Kind::String: return feed_string(n, n.dfa == kNone ? nullptr : &g.dfas_[n.dfa], f, c);
        case Kind::Number: return feed_number(n, f, c);
        case Kind::Any:
        case Kind::Union: {
            const int cls = first_byte_class(c);
            if (cls < 0) return kReject;
            uint32_t target;
            if (n.kind == Kind::Union) {
                target = n.by_class[cls];
            } else {
                const uint32_t leaf[kClasses] = {g.any_string_, g.any_object_, g.any_array_, g.any_number_, g.any_lit_, g.any_lit_};
                target = leaf[cls];
                // An any-value container needs room for its children; scalars always fit.
                if ((cls == kObj || cls == kArr) && s.depth + 4 > kMaxFrames) return kReject;
            }
            if (target == kNone) return kReject;
            init_frame(g, f, target, 0, 0);
            return kRetry;
        }
        case Kind::Calls:
            switch (f.phase) {
                case 0: if (c != '[') return kReject; f.phase = 1; return kConsumed;
                case 1:
                case 5:
                    if (c == ']') {
                        if (f.phase == 1 && n.require_call) return kReject;
                        s.complete = true, f.phase = 9;
                        return kConsumed;
                    }
                    if (f.phase == 1 && c == '{') break;
                    if (f.phase == 5 && c == ',' && !n.single) { f.phase = 6; return kConsumed; }
                    return kReject;
                case 6: if (c != '{') return kReject; break;
                case 4: if (c != '}') return kReject; f.phase = 5; return kConsumed;
                default: return kReject;
            }
            f.phase = 2;
            return push(g, s, n.keys) ? kRetry : kReject;
        case Kind::Object:
            switch (f.phase) {
                case 0: if (c != '{') return kReject; f.phase = 1; return kConsumed;
                case 1:
                case 4:
                    if (c == '}') return (n.required & ~f.bits) == 0 ? kDone : kReject;
                    if (f.phase == 1 && c == '"') break;
                    if (f.phase == 4 && c == ',' && (f.bits & all) != all) { f.phase = 5; return kConsumed; }
                    return kReject;
                case 5: if (c != '"') return kReject; break;
                default: return kReject;
            }
            if ((f.bits & all) == all) return kReject;
            f.phase = 2;
            return push(g, s, n.keys, 1, f.bits) ? kRetry : kReject;
        case Kind::AnyObject:
            switch (f.phase) {
                case 0: if (c != '{') return kReject; f.phase = 1; return kConsumed;
                case 1: if (c == '}') return kDone; [[fallthrough]];
                case 6:
                    if (c != '"') return kReject;
                    f.phase = 2;
                    return push(g, s, g.any_string_) ? kRetry : kReject;
                case 3:
                    if (c != ':') return kReject;
                    f.phase = 4;
                    return push(g, s, g.any_) ? kConsumed : kReject;
                case 5:
                    if (c == '}') return kDone;
                    if (c != ',') return kReject;
                    f.phase = 6;
                    return kConsumed;
                default: return kReject;
            }
        case Kind::Array:
            switch (f.phase) {
                case 0: if (c != '[') return kReject; f.phase = 1; return kConsumed;
                case 1:
                    if (c == ']') return n.min_count == 0 ? kDone : kReject;
                    if (n.max_count == 0) return kReject;
                    f.phase = 2;
                    return push(g, s, n.items) ? kRetry : kReject;
                case 3:
                    if (c == ']') return f.a >= n.min_count ? kDone : kReject;
                    if (c != ',' || f.a >= n.max_count) return kReject;
                    f.phase = 4;
                    return kConsumed;
                case 4:
                    f.phase = 2;
                    return push(g, s, n.items) ? kRetry : kReject;
                default: return kReject;
            }
    }
    return kReject;
}

// A child frame finished: the parent moves on.
bool child_done(const Grammar &g, State &s, Frame &f) {
    const Node &n = g.nodes_[f.node];
    switch (n.kind) {
        case Kind::Calls:
            if (f.phase == 2) { f.phase = 3; return push(g, s, g.tool_params_[s.result]); }
            if (f.phase == 3) { f.phase = 4; return true; }
            return false;
        case Kind::Object:
            if (f.phase == 2) {
                f.bits |= uint64_t(1) << s.result;
                f.phase = 3;
                return push(g, s, n.props[s.result].node);
            }
            if (f.phase == 3) { f.phase = 4; return true; }
            return false;
        case Kind::AnyObject:
            if (f.phase == 2 || f.phase == 4) { ++f.phase; return true; }
            return false;
        case Kind::Array:
            if (f.phase == 2) { ++f.a, f.phase = 3; return true; }
            return false;
        default:
            return false;
    }
}

bool step(const Grammar &g, State &s, uint8_t c) {
    if (s.complete) return false;
    for (uint32_t guard = 0; guard < 4 * kMaxFrames; ++guard) {
        Frame &f = s.f[s.depth - 1];
        const R r = feed(g, s, f, c);
        switch (r) {
            case kConsumed: return true;
            case kReject: return false;
            case kRetry: continue;
            case kDone:
            case kPass:
                if (--s.depth == 0) return false;
                if (!child_done(g, s, s.f[s.depth - 1])) return false;
                if (r == kDone) return true;
                continue;
        }
    }
    return false;
}

}  // namespace

// ---------------------------------------------------------------- matcher

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g, const TokenBytes &tokens)
    : g_(std::move(g)), tok_(tokens) {
    const uint32_t levels = std::max(tok_.full_trie().max_depth, tok_.special_trie().max_depth) + 1;
    states_.reset(new State[2 + levels]);
    stack_node_.resize(levels + 1);
    stack_child_.resize(levels + 1);
    reset();
}

GrammarMatcher::~GrammarMatcher() = default;

void GrammarMatcher::reset() {
    State &s = states_[0];
    s.depth = 0;
    s.complete = false;
    s.result = 0;
    push(*g_, s, g_->root_);
}

bool GrammarMatcher::complete() const { return states_[0].complete; }

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
    State &t = states_[1];
    copy_state(t, states_[0]);
    for (char c : bytes)
        if (!step(*g_, t, uint8_t(c))) return false;
    copy_state(states_[0], t);
    return true;
}

bool GrammarMatcher::accept(uint32_t id) {
    if (id >= tok_.size()) return false;
    if (complete()) return int64_t(id) == tok_.end_call_id();
    if (tok_.is_marker(id) || tok_.bytes(id).empty()) return false;
    return accept_bytes(tok_.bytes(id));
}

size_t GrammarMatcher::fill_mask(uint64_t *mask) {
    const uint32_t W = tok_.words();
    std::memset(mask, 0, sizeof(uint64_t) * W);
    const State &cur = states_[0];
    if (cur.complete) {
        if (tok_.end_call_id() < 0) return 0;
        const uint64_t id = uint64_t(tok_.end_call_id());
        mask[id / 64] |= uint64_t(1) << (id % 64);
        return 1;
    }
    const TokenBytes::Trie *trie = &tok_.full_trie();
    // Fast path inside a free string: plain text tokens come from the precomputed masks and
    // only the other tokens are walked. (A pattern is checked after decoding, §6.4.)
    const Frame &top = cur.f[cur.depth - 1];
    const Node &tn = g_->nodes_[top.node];
    if (tn.kind == Kind::String && top.phase == 1 && tn.dfa == kNone) {
        const uint32_t room = tn.max_count - top.a;
        const uint64_t *plain = tok_.plain_upto(std::min(room, TokenBytes::kPlainMax));
        for (uint32_t w = 0; w < W; ++w) mask[w] = plain[w];
        trie = &tok_.special_trie();
    }
    // Depth-first walk of the trie; level L's state is states_[1 + L] (level 0: the current).
    const auto &T = *trie;
    uint32_t d = 0;
    stack_node_[0] = 0;
    stack_child_[0] = T.nodes[0].child_begin;
    for (;;) {
        const uint32_t ci = stack_child_[d];
        if (ci == T.nodes[stack_node_[d]].child_end) {
            if (d == 0) break;
            --d;
            continue;
        }
        ++stack_child_[d];
        State &dst = states_[2 + d];
        copy_state(dst, d == 0 ? states_[0] : states_[1 + d]);
        if (!step(*g_, dst, T.child_byte[ci])) continue;
        const auto &cn = T.nodes[T.child_node[ci]];
        for (uint32_t t = cn.tok_begin; t < cn.tok_end; ++t) mask[T.tokens[t] / 64] |= uint64_t(1) << (T.tokens[t] % 64);
        if (cn.child_begin != cn.child_end) {
            ++d;
            stack_node_[d] = T.child_node[ci];
            stack_child_[d] = cn.child_begin;
        }
    }
    size_t count = 0;
    for (uint32_t w = 0; w < W; ++w) count += size_t(__builtin_popcountll(mask[w]));
    return count;
}

}  // namespace chat
}  // namespace needle
