// ECMAScript-subset pattern -> NFA -> DFA over code-point classes (grammar_regex.h).
#include "chat/grammar_regex.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <string>

namespace needle {
namespace chat {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr uint32_t kInf = UINT32_MAX;
constexpr size_t kMaxNfa = 2048;
constexpr uint32_t kMaxClasses = 160;
constexpr uint64_t kMaxWork = uint64_t(20) << 20;  // NFA-state visits of the subset construction
constexpr int kMaxNest = 32;

Ranges normalize(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (auto &x : r) {
        if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
        else out.push_back(x);
    }
    return out;
}
Ranges complement(const Ranges &r) {
    Ranges out;
    uint32_t next = 0;
    for (auto &x : r) {
        if (x.first > next) out.push_back({next, x.first - 1});
        next = x.second + 1;
    }
    if (next <= kMaxCp) out.push_back({next, kMaxCp});
    return out;
}

// The code points a JSON string can carry: not the surrogates (the matcher writes none, raw or
// escaped, and the JSON parser keeps a lone "\udc00" in a pattern as one). A pattern literal or
// class that only a surrogate satisfies would be a DFA edge no byte can take: the mask after
// the prefix before it was empty (fuzz_grammar). Cut out, such a path is dead like any other.
Ranges without_surrogates(const Ranges &r) {
    Ranges out;
    for (const auto &x : r) {
        if (x.first < 0xD800) out.push_back({x.first, std::min<uint32_t>(x.second, 0xD7FF)});
        if (x.second > 0xDFFF) out.push_back({std::max<uint32_t>(x.first, 0xE000), x.second});
    }
    return out;
}

struct Re {
    enum T { Set, Cat, Alt, Rep } t;
    explicit Re(T type) : t(type) {}
    int set = -1;
    std::vector<int> kids;
    uint32_t min = 0, max = 0;
};

struct Unsupported {};

class Parser {
public:
    explicit Parser(const std::string &p) : p_(p) {}
    std::vector<Re> re;
    std::vector<Ranges> sets;

    int parse_all() {
        const int r = alt(0);
        if (i_ != p_.size()) throw Unsupported{};  // unmatched ')'
        return r;
    }

private:
    const std::string &p_;
    size_t i_ = 0;

    int node(Re r) {
        re.push_back(std::move(r));
        return int(re.size() - 1);
    }
    int set_node(Ranges r) {
        sets.push_back(normalize(std::move(r)));
        Re n{Re::Set};
        n.set = int(sets.size() - 1);
        return node(n);
    }
    bool eof() const { return i_ >= p_.size(); }

    // One code point of the (UTF-8) pattern.
    uint32_t cp() {
        const uint8_t c = uint8_t(p_[i_]);
        int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        uint32_t v = n == 1 ? c : c & (0x3F >> (n - 1));
        if (i_ + size_t(n) > p_.size()) throw Unsupported{};
        for (int k = 1; k < n; ++k) v = v << 6 | (uint8_t(p_[i_ + size_t(k)]) & 0x3F);
        i_ += size_t(n);
        return v;
    }

    int alt(int depth) {
        if (depth > kMaxNest) throw Unsupported{};
        Re a{Re::Alt};
        a.kids.push_back(cat(depth));
        while (!eof() && p_[i_] == '|') {
            ++i_;
            a.kids.push_back(cat(depth));
        }
        return a.kids.size() == 1 ? a.kids[0] : node(a);
    }

    int cat(int depth) {
        Re c{Re::Cat};
        while (!eof() && p_[i_] != '|' && p_[i_] != ')') c.kids.push_back(quant(atom(depth)));
        return node(c);
    }

    // A decimal count. It saturates just above kMaxPatternRepeat (no wraparound however many
    // digits); quant() refuses such a count (repeat_refusal has named it first).
    bool number(uint32_t &v) {
        if (eof() || !isdigit(uint8_t(p_[i_]))) return false;
        v = 0;
        while (!eof() && isdigit(uint8_t(p_[i_]))) {
            v = std::min<uint32_t>(v * 10 + uint32_t(p_[i_++] - '0'), kMaxPatternRepeat + 1);
        }
        return true;
    }

    int quant(int a) {
        if (eof()) return a;
        uint32_t mn, mx;
        const char c = p_[i_];
        if (c == '*') mn = 0, mx = kInf, ++i_;
        else if (c == '+') mn = 1, mx = kInf, ++i_;
        else if (c == '?') mn = 0, mx = 1, ++i_;
        else if (c == '{') {
            const size_t save = i_++;
            if (!number(mn)) { i_ = save; return a; }  // a literal '{' (Annex B)
            mx = mn;
            if (!eof() && p_[i_] == ',') {
                ++i_;
                if (!number(mx)) mx = kInf;
            }
            if (eof() || p_[i_] != '}') { i_ = save; return a; }  // a literal '{'
            if (mn > kMaxPatternRepeat || (mx != kInf && mx > kMaxPatternRepeat)) throw Unsupported{};
            if (mx < mn) throw Unsupported{};
            ++i_;
        } else {
            return a;
        }
        if (!eof() && p_[i_] == '?') ++i_;  // lazy: same language
        if (!eof() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?')) throw Unsupported{};
        Re r{Re::Rep};
        r.kids.push_back(a);
        r.min = mn, r.max = mx;
        return node(r);
    }

    // Class escapes \d \w \s and their negations; false if c is none of them.
    static bool class_escape(char c, Ranges &out) {
        Ranges r;
        switch (c | 0x20) {
            case 'd': r = {{'0', '9'}}; break;
            case 'w': r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
            case 's':
                r = {{9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                     {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
                break;
            default: return false;
        }
        r = normalize(r);
        const auto add = c >= 'a' ? r : complement(r);
        out.insert(out.end(), add.begin(), add.end());
        return true;
    }

    uint32_t hex(int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
            if (eof() || !isxdigit(uint8_t(p_[i_]))) throw Unsupported{};
            const char h = p_[i_++];
            v = v * 16 + uint32_t(isdigit(uint8_t(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
    }

    // A character escape after '\' (class escapes handled by the caller).
    uint32_t char_escape(bool in_class) {
        if (eof()) throw Unsupported{};
        const char c = p_[i_++];
        switch (c) {
            case 't': return 9;
            case 'n': return 10;
            case 'v': return 11;
            case 'f': return 12;
            case 'r': return 13;
            case '0': if (!eof() && isdigit(uint8_t(p_[i_]))) throw Unsupported{}; return 0;
            case 'x': return hex(2);
            case 'u': {
                const uint32_t v = hex(4);
                if (v >= 0xD800 && v <= 0xDFFF) throw Unsupported{};
                return v;
            }
            case 'b': if (in_class) return 8; throw Unsupported{};
            default:
                // Identity escapes of syntax characters only; \1, \B, \k, \p ... are not ours.
                if (std::string("^$\\.*+?()[]{}|/-").find(c) == std::string::npos) throw Unsupported{};
                return uint8_t(c);
        }
    }

    int klass() {
        bool neg = false;
        if (!eof() && p_[i_] == '^') neg = true, ++i_;
        Ranges r;
        bool first = true;
        for (;;) {
            if (eof()) throw Unsupported{};
            if (p_[i_] == ']' && !first) break;
            if (p_[i_] == ']') { ++i_; r.push_back({']', ']'}); first = false; continue; }
            first = false;
            uint32_t lo;
            if (p_[i_] == '\\') {
                ++i_;
                if (!eof() && class_escape(p_[i_], r)) { ++i_; continue; }
                lo = char_escape(true);
            } else {
                lo = cp();
            }
            uint32_t hi = lo;
            if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
                ++i_;
                if (p_[i_] == '\\') {
                    ++i_;
                    if (!eof() && (p_[i_] | 0x20) >= 'd' && std::string("dDwWsS").find(p_[i_]) != std::string::npos)
                        throw Unsupported{};
                    hi = char_escape(true);
                } else {
                    hi = cp();
                }
                if (hi < lo) throw Unsupported{};
            }
            r.push_back({lo, hi});
        }
        ++i_;  // ']'
        r = normalize(r);
        return set_node(neg ? complement(r) : r);
    }

    int atom(int depth) {
        const char c = p_[i_];
        if (c == '(') {
            ++i_;
            if (!eof() && p_[i_] == '?') {
                if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') i_ += 2;
                else throw Unsupported{};  // lookaround, named groups
            }
            const int r = alt(depth + 1);
            if (eof() || p_[i_] != ')') throw Unsupported{};
            ++i_;
            return r;
        }
        if (c == '[') { ++i_; return klass(); }
        if (c == '.') { ++i_; return set_node(complement(normalize({{10, 10}, {13, 13}, {0x2028, 0x2029}}))); }
        if (c == '^' || c == '$' || c == '*' || c == '+' || c == '?') throw Unsupported{};
        if (c == '\\') {
            ++i_;
            Ranges r;
            if (!eof() && class_escape(p_[i_], r)) { ++i_; return set_node(r); }
            const uint32_t v = char_escape(false);
            return set_node({{v, v}});
        }
        const uint32_t v = cp();
        return set_node({{v, v}});
    }
};

struct Nfa {
    struct State { std::vector<int> eps; int set = -1, to = -1; };
    std::vector<State> s;
    int add() {
        if (s.size() >= kMaxNfa) throw Unsupported{};
        s.emplace_back();
        return int(s.size() - 1);
    }
    // Fragment of AST node n: returns {start, end}.
    std::pair<int, int> build(const std::vector<Re> &re, int n, int depth) {
        if (depth > 4 * kMaxNest + 8) throw Unsupported{};
        const Re &r = re[size_t(n)];
        const int a = add(), b = add();
        switch (r.t) {
            case Re::Set: s[size_t(a)].set = r.set, s[size_t(a)].to = b; break;
            case Re::Cat: {
                int cur = a;
                for (int k : r.kids) {
                    auto f = build(re, k, depth + 1);
                    s[size_t(cur)].eps.push_back(f.first);
                    cur = f.second;
                }
                s[size_t(cur)].eps.push_back(b);
                break;
            }
            case Re::Alt:
                for (int k : r.kids) {
                    auto f = build(re, k, depth + 1);
                    s[size_t(a)].eps.push_back(f.first);
                    s[size_t(f.second)].eps.push_back(b);
                }
                break;
            case Re::Rep: {
                int cur = a;
                for (uint32_t k = 0; k < r.min; ++k) {
                    auto f = build(re, r.kids[0], depth + 1);
                    s[size_t(cur)].eps.push_back(f.first);
                    cur = f.second;
                }
                if (r.max == kInf) {
                    auto f = build(re, r.kids[0], depth + 1);
                    s[size_t(cur)].eps.push_back(f.first);
                    s[size_t(f.second)].eps.push_back(cur);
                    s[size_t(cur)].eps.push_back(b);
                } else {
                    for (uint32_t k = r.min; k < r.max; ++k) {
                        auto f = build(re, r.kids[0], depth + 1);
                        s[size_t(cur)].eps.push_back(f.first);
                        s[size_t(cur)].eps.push_back(b);
                        cur = f.second;
                    }
                    s[size_t(cur)].eps.push_back(b);
                }
                break;
            }
        }
        return {a, b};
    }
    void closure(std::vector<int> &set) const {
        std::vector<int> stack(set.begin(), set.end());
        std::vector<char> in(s.size(), 0);
        for (int x : set) in[size_t(x)] = 1;
        while (!stack.empty()) {
            const int x = stack.back();
            stack.pop_back();
            for (int y : s[size_t(x)].eps)
                if (!in[size_t(y)]) in[size_t(y)] = 1, stack.push_back(y), set.push_back(y);
        }
        std::sort(set.begin(), set.end());
    }
};

// The first quantifier {n} {n,} {n,m} of `p` with a count above kMaxPatternRepeat, as a
// message ("" if none). A lexical scan, not the parser: it must also see counts in patterns
// the parser gives up on earlier (a lookahead before them), which go to std::regex otherwise.
// Escapes are skipped, and class contents (a ']' first in the class is literal, as the parser
// reads it); a '{' that does not close a well-formed quantifier is a literal (Annex B).
std::string repeat_refusal(const std::string &p) {
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\') { ++i; continue; }
        if (in_class) { in_class = c != ']'; continue; }
        if (c == '[') {
            in_class = true;
            if (i + 1 < p.size() && p[i + 1] == '^') ++i;
            if (i + 1 < p.size() && p[i + 1] == ']') ++i;
            continue;
        }
        if (c != '{' || i == 0) continue;
        // Digit runs as text: compared by length first, so no count can overflow.
        const auto digits = [&](size_t &k) {
            const size_t b = k;
            while (k < p.size() && isdigit(uint8_t(p[k]))) ++k;
            return p.substr(b, k - b);
        };
        size_t k = i + 1;
        const std::string lo = digits(k);
        std::string hi;
        if (lo.empty()) continue;
        if (k < p.size() && p[k] == ',') ++k, hi = digits(k);
        if (k >= p.size() || p[k] != '}') continue;
        const std::string limit = std::to_string(kMaxPatternRepeat);
        for (const std::string &n : {lo, hi}) {
            const size_t z = std::min(n.find_first_not_of('0'), n.size());
            const std::string v = n.substr(z);
            if (v.size() > limit.size() || (v.size() == limit.size() && v > limit))
                return "repeat count " + v + " exceeds the limit of " + limit;
        }
        i = k;
    }
    return "";
}

}  // namespace

uint32_t PatternDfa::class_of(uint32_t cp) const {
    return uint32_t(std::upper_bound(bounds.begin(), bounds.end(), cp) - bounds.begin()) - 1;
}

bool PatternDfa::any_live(uint16_t q, uint32_t lo, uint32_t hi, uint32_t room) const {
    if (lo > hi || room == 0) return false;
    const uint32_t C = classes(), c1 = class_of(hi);
    for (uint32_t c = class_of(lo); c <= c1; ++c) {
        const uint16_t n = next[size_t(q) * C + c];
        if (n != kDead && mindist[n] < room) return true;
    }
    return false;
}

bool compile_pattern(const std::string &pattern, PatternDfa &out, std::string *refusal) {
    std::string why = repeat_refusal(pattern);
    const bool refused = !why.empty();
    if (refusal) *refusal = std::move(why);
    if (refused) return false;
    try {
        std::string body = pattern;
        bool anchor_start = false, anchor_end = false;
        if (!body.empty() && body[0] == '^') anchor_start = true, body.erase(0, 1);
        if (!body.empty() && body.back() == '$') {
            size_t bs = 0;
            for (size_t k = body.size() - 1; k-- > 0 && body[k] == '\\';) ++bs;
            if (bs % 2 == 0) anchor_end = true, body.pop_back();
        }
        Parser p(body);
        int root = p.parse_all();
        if ((anchor_start || anchor_end) && p.re[size_t(root)].t == Re::Alt) return false;
        // Unanchored sides match anywhere (JSON Schema patterns search).
        const auto any_star = [&] {
            Re set{Re::Set};
            p.sets.push_back({{0, kMaxCp}});
            set.set = int(p.sets.size() - 1);
            p.re.push_back(set);
            Re rep{Re::Rep};
            rep.kids = {int(p.re.size() - 1)};
            rep.min = 0, rep.max = kInf;
            p.re.push_back(rep);
            return int(p.re.size() - 1);
        };
        Re cat{Re::Cat};
        if (!anchor_start) cat.kids.push_back(any_star());
        cat.kids.push_back(root);
        if (!anchor_end) cat.kids.push_back(any_star());
        p.re.push_back(cat);
        root = int(p.re.size() - 1);
        Nfa nfa;
        const auto [ns, ne] = nfa.build(p.re, root, 0);
        for (auto &set : p.sets) set = without_surrogates(set);
        // Code-point classes from every range boundary.
        std::vector<uint32_t> b{0, kMaxCp + 1};
        for (const auto &s : p.sets)
            for (const auto &r : s) b.push_back(r.first), b.push_back(r.second + 1);
        std::sort(b.begin(), b.end());
        b.erase(std::unique(b.begin(), b.end()), b.end());
        const uint32_t C = uint32_t(b.size() - 1);
        if (C > kMaxClasses) return false;
        uint64_t work = 0;
        std::vector<std::vector<char>> member(p.sets.size(), std::vector<char>(C, 0));
        for (size_t si = 0; si < p.sets.size(); ++si)
            for (const auto &r : p.sets[si])
                for (uint32_t c = uint32_t(std::lower_bound(b.begin(), b.end(), r.first) - b.begin());
                     c < C && b[c] <= r.second; ++c)
                    member[si][c] = 1;
        // Subset construction.
        std::map<std::vector<int>, uint16_t> ids;
        std::vector<std::vector<int>> states;
        std::vector<uint32_t> next;
        std::vector<int> s0{ns};
        nfa.closure(s0);
        ids[s0] = 0;
        states.push_back(s0);
        for (size_t q = 0; q < states.size(); ++q) {
            for (uint32_t c = 0; c < C; ++c) {
                std::vector<int> t;
                for (int x : states[q]) {
                    const auto &st = nfa.s[size_t(x)];
                    if (st.set >= 0 && member[size_t(st.set)][c]) t.push_back(st.to);
                }
                if (t.empty()) { next.push_back(PatternDfa::kDead); continue; }
                work += nfa.s.size() + states[q].size();
                if (work > kMaxWork) return false;
                nfa.closure(t);
                t.erase(std::unique(t.begin(), t.end()), t.end());
                auto it = ids.find(t);
                if (it == ids.end()) {
                    if (states.size() >= PatternDfa::kMaxDfaStates) return false;
                    it = ids.emplace(t, uint16_t(states.size())).first;
                    states.push_back(t);
                }
                next.push_back(it->second);
            }
        }
        const size_t Q = states.size();
        PatternDfa d;
        d.bounds = b;
        d.accept.resize(Q);
        for (size_t q = 0; q < Q; ++q) d.accept[q] = std::binary_search(states[q].begin(), states[q].end(), ne);
        // mindist by BFS over reversed edges from the accepting states; unreachable = dead.
        std::vector<std::vector<uint16_t>> rev(Q);
        for (size_t q = 0; q < Q; ++q)
            for (uint32_t c = 0; c < C; ++c)
                if (next[q * C + c] != PatternDfa::kDead) rev[next[q * C + c]].push_back(uint16_t(q));
        d.mindist.assign(Q, UINT32_MAX);
        std::deque<uint16_t> bfs;
        for (size_t q = 0; q < Q; ++q)
            if (d.accept[q]) d.mindist[q] = 0, bfs.push_back(uint16_t(q));
        while (!bfs.empty()) {
            const uint16_t q = bfs.front();
            bfs.pop_front();
            for (uint16_t r : rev[q])
                if (d.mindist[r] == UINT32_MAX) d.mindist[r] = d.mindist[q] + 1, bfs.push_back(r);
        }
        d.next.resize(next.size());
        for (size_t k = 0; k < next.size(); ++k)
            d.next[k] = next[k] == PatternDfa::kDead || d.mindist[next[k]] == UINT32_MAX ? PatternDfa::kDead : uint16_t(next[k]);
        d.start = 0;
        out = std::move(d);
        return true;
    } catch (const Unsupported &) {
        return false;
    }
}

}  // namespace chat
}  // namespace needle
