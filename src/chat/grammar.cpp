// Grammar compilation from the tool schemas (tool-calling.md §6.4) and the post-decode checks.
#include "chat/grammar.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <unordered_set>

#include "core/error.h"

namespace needle {
namespace chat {

using namespace gram;

namespace {

std::string canonical(const JsonValue &v) {
    std::string s;
    write_canonical(v, s);
    return s;
}

const JsonValue *member(const JsonValue *s, const char *key) {
    return s && s->kind == JsonValue::Kind::Object ? s->find(key) : nullptr;
}
bool is_number(const JsonValue *v) {
    return v && (v->kind == JsonValue::Kind::Int || v->kind == JsonValue::Kind::Float) && !std::isnan(v->number);
}
// A count keyword (minLength, maxItems...): a non-negative integer, else `dflt`.
uint32_t count_kw(const JsonValue *s, const char *key, uint32_t dflt) {
    const JsonValue *v = member(s, key);
    if (!is_number(v) || v->number < 0) return dflt;
    return v->number >= 4e9 ? UINT32_MAX - 1 : uint32_t(std::ceil(v->number));
}

class Compiler {
public:
    Compiler(Grammar &g, const GrammarOptions &opt) : g_(g), opt_(opt) {}

    uint32_t add(Node n, bool sat) {
        g_.nodes_.push_back(std::move(n));
        sat_.push_back(sat);
        return uint32_t(g_.nodes_.size() - 1);
    }
    bool sat(uint32_t n) const { return sat_[n]; }

    uint32_t litset(std::vector<Lit> alts) {
        std::sort(alts.begin(), alts.end(), [](const Lit &a, const Lit &b) { return a.bytes < b.bytes; });
        alts.erase(std::unique(alts.begin(), alts.end(), [](const Lit &a, const Lit &b) { return a.bytes == b.bytes; }),
                   alts.end());
        for (const Lit &a : alts)
            if (a.bytes.size() > 60000)
                fail(NEEDLE_E_INVALID_ARGUMENT, strf("a name, key or enum value of %zu bytes is too long for the grammar",
                                                     a.bytes.size()));
        Node n;
        n.kind = Kind::LitSet;
        n.lit_begin = uint32_t(g_.lits_.size());
        for (auto &a : alts) g_.lits_.push_back(std::move(a));
        n.lit_end = uint32_t(g_.lits_.size());
        return add(std::move(n), n.lit_end > n.lit_begin);
    }

    // The shared leaves of "any JSON value" (node g_.any_).
    void any_nodes() {
        Node any;
        any.kind = Kind::Any;
        g_.any_ = add(any, true);
        Node str;
        str.kind = Kind::String;
        g_.any_string_ = add(str, true);
        g_.any_object_ = any_object();
        Node arr;
        arr.kind = Kind::Array;
        arr.items = g_.any_;
        g_.any_array_ = add(arr, true);
        Node num;
        num.kind = Kind::Number;
        g_.any_number_ = add(num, true);
        g_.any_lit_ = litset({{"false", 0}, {"null", 0}, {"true", 0}});
    }

    uint32_t schema(const JsonValue *s, uint32_t depth) {
        if (depth > kMaxSchemaDepth)
            fail(NEEDLE_E_INVALID_ARGUMENT, strf("tool schema nested deeper than %u levels", kMaxSchemaDepth));
        if (!s || s->kind != JsonValue::Kind::Object) return g_.any_;
        if (const JsonValue *c = member(s, "const")) return litset({{canonical(*c), 0}});
        if (const JsonValue *e = member(s, "enum"); e && e->kind == JsonValue::Kind::Array) {
            std::vector<Lit> alts;
            for (const auto &v : e->items) alts.push_back({canonical(v), 0});
            return litset(std::move(alts));
        }
        std::vector<std::string> types;
        const JsonValue *t = member(s, "type");
        if (t && t->kind == JsonValue::Kind::String) types.push_back(t->text);
        else if (t && t->kind == JsonValue::Kind::Array)
            for (const auto &v : t->items)
                if (v.kind == JsonValue::Kind::String) types.push_back(v.text);
        // [C] no type but "properties": an object (the author means one); otherwise any value.
        if (!t && member(s, "properties")) types.push_back("object");
        if (types.empty()) return g_.any_;
        uint32_t by_class[kClasses] = {kNone, kNone, kNone, kNone, kNone, kNone};
        uint32_t n_types = 0, last = kNone;
        const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
        for (const std::string &ty : types) {
            int cls = -1;
            uint32_t node = kNone;
            if (ty == "string") cls = kStr, node = string_node(s);
            else if (ty == "number" || (ty == "integer" && !has_number)) cls = kNum, node = number_node(s, ty == "integer");
            else if (ty == "boolean") cls = kBool, node = litset({{"false", 0}, {"true", 0}});
            else if (ty == "null") cls = kNull, node = litset({{"null", 0}});
            else if (ty == "array") cls = kArr, node = array_node(s, depth);
            else if (ty == "object") cls = kObj, node = object_node(s, depth);
            if (cls < 0 || by_class[cls] != kNone || !sat(node)) continue;
            by_class[cls] = node;
            last = node;
            ++n_types;
        }
        if (n_types == 0) {
            // Only unknown or unsatisfiable types: unknown alone means any value, else nothing.
            bool known = false;
            for (const auto &ty : types)
                known = known || ty == "string" || ty == "number" || ty == "integer" || ty == "boolean" ||
                        ty == "null" || ty == "array" || ty == "object";
            return known ? litset({}) : g_.any_;
        }
        if (n_types == 1) return last;
        Node u;
        u.kind = Kind::Union;
        std::copy(by_class, by_class + kClasses, u.by_class);
        return add(std::move(u), true);
    }

    uint32_t string_node(const JsonValue *s) {
        Node n;
        n.kind = Kind::String;
        n.min_count = count_kw(s, "minLength", 0);
        n.max_count = count_kw(s, "maxLength", UINT32_MAX);
        if (const JsonValue *p = member(s, "pattern"); p && p->kind == JsonValue::Kind::String) n.pattern = p->text;
        if (const JsonValue *f = member(s, "format"); f && f->kind == JsonValue::Kind::String) n.format = f->text;
        bool ok = n.min_count <= n.max_count;
        // [C] The pattern becomes part of the grammar when it is in the subset and no minLength
        // applies (min length and pattern together could leave dead ends); else post_check.
        PatternDfa dfa;
        if (!n.pattern.empty() && n.min_count == 0 && compile_pattern(n.pattern, dfa)) {
            const uint32_t d0 = dfa.mindist[dfa.start];
            ok = ok && d0 != UINT32_MAX && d0 <= n.max_count;
            n.dfa = uint32_t(g_.dfas_.size());
            g_.dfas_.push_back(std::move(dfa));
        }
        return add(std::move(n), ok);
    }

    uint32_t number_node(const JsonValue *s, bool integer) {
        Node n;
        n.kind = Kind::Number;
        n.integer = integer;
        n.lo = -HUGE_VAL, n.hi = HUGE_VAL;
        const auto bound = [&](const char *key, bool low, bool inc) {
            const JsonValue *v = member(s, key);
            if (!is_number(v)) return;
            double &b = low ? n.lo : n.hi;
            bool &bi = low ? n.lo_inc : n.hi_inc;
            // The tighter bound wins; at equal values exclusive is tighter.
            if (low ? (v->number > b || (v->number == b && !inc)) : (v->number < b || (v->number == b && !inc)))
                b = v->number, bi = inc;
            n.bounded = true;
        };
        bound("minimum", true, true);
        bound("exclusiveMinimum", true, false);
        bound("maximum", false, true);
        bound("exclusiveMaximum", false, false);
        if (const JsonValue *m = member(s, "multipleOf"); is_number(m) && m->number > 0) n.multiple_of = m->number;
        bool ok;
        if (integer) {
            // Inclusive integer bounds.
            if (std::isfinite(n.lo)) n.lo = n.lo_inc ? std::ceil(n.lo) : std::floor(n.lo) + 1;
            if (std::isfinite(n.hi)) n.hi = n.hi_inc ? std::floor(n.hi) : std::ceil(n.hi) - 1;
            n.lo_inc = n.hi_inc = true;
            ok = n.lo <= n.hi;
        } else {
            ok = n.lo < n.hi || (n.lo == n.hi && n.lo_inc && n.hi_inc);
        }
        // A bounded value has at most kBoundedDigits digits: a non-empty range beyond them
        // ("minimum": 1e19) is as unsatisfiable as an empty one. Marked so, the node is dropped
        // like any other (from a union, an optional key, a tool) instead of leaving the matcher
        // a frame no byte can continue (fill_mask 0: error_code "internal" every turn).
        ok = ok && (!n.bounded || range_writable(integer, n.lo, n.lo_inc, n.hi, n.hi_inc));
        return add(std::move(n), ok);
    }

    uint32_t array_node(const JsonValue *s, uint32_t depth) {
        Node n;
        n.kind = Kind::Array;
        const JsonValue *it = member(s, "items");
        n.items = it && it->kind == JsonValue::Kind::Object ? schema(it, depth + 1) : g_.any_;
        n.min_count = count_kw(s, "minItems", 0);
        n.max_count = count_kw(s, "maxItems", UINT32_MAX);
        if (const JsonValue *u = member(s, "uniqueItems")) n.unique = u->kind == JsonValue::Kind::True;
        bool ok = n.min_count <= n.max_count;
        if (!sat(n.items)) {
            if (n.min_count > 0) ok = false;
            n.max_count = 0;  // only [] remains
        }
        return add(std::move(n), ok);
    }

    uint32_t object_node(const JsonValue *s, uint32_t depth) {
        const JsonValue *props = member(s, "properties");
        if (!props || props->kind != JsonValue::Kind::Object) return any_object();
        if (props->members.size() > kMaxProperties)
            fail(NEEDLE_E_INVALID_ARGUMENT,
                 strf("object schema with %zu properties (the grammar supports %u)", props->members.size(),
                      kMaxProperties));
        Node n;
        n.kind = Kind::Object;
        std::vector<std::string> required;
        if (const JsonValue *r = member(s, "required"); r && r->kind == JsonValue::Kind::Array)
            for (const auto &v : r->items)
                if (v.kind == JsonValue::Kind::String) required.push_back(v.text);
        bool ok = true;
        std::vector<Lit> keys;
        for (const auto &[key, sub] : props->members) {
            const uint32_t child = schema(&sub, depth + 1);
            // [C] `required` names missing from properties are ignored (§6.4).
            const bool req = std::find(required.begin(), required.end(), key) != required.end();
            if (!sat(child)) {
                if (req) ok = false;  // can never close: the whole object is unsatisfiable
                continue;              // an optional key whose value cannot be written is dropped
            }
            const uint32_t slot = uint32_t(n.props.size());
            n.props.push_back({child, req, key});
            if (req && opt_.require_required) n.required |= uint64_t(1) << slot;
            std::string lit;
            write_canonical_string(key, lit);
            lit += ':';
            keys.push_back({std::move(lit), slot});
        }
        n.keys = litset(std::move(keys));
        return add(std::move(n), ok);
    }

    uint32_t any_object() {
        Node n;
        n.kind = Kind::AnyObject;
        return add(std::move(n), true);
    }

private:
    Grammar &g_;
    const GrammarOptions &opt_;
    std::vector<bool> sat_;
};

}  // namespace

bool gram::grid_hit(const Node &n, double A, double B, uint32_t frac, bool neg) {
    static const double kPow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
    const double scale = kPow10[std::min<uint32_t>(frac, kBoundedDigits)];
    const auto in = [&](double m) {
        const double x = neg ? -(m / scale) : m / scale;
        return (n.lo_inc ? x >= n.lo : x > n.lo) && (n.hi_inc ? x <= n.hi : x < n.hi);
    };
    // The smallest m whose value clears the bound it approaches first (lo for positive values,
    // hi for negative ones) is ceil(bound * scale) within one (rounding); values move
    // monotonically with m, so that m, clamped into [A, B], and its two neighbours decide.
    const double bound = neg ? -n.hi : n.lo;
    const double m0 = std::min(B, std::max(A, std::ceil(bound * scale)));  // -inf, +inf clamp too
    for (double m = std::max(A, m0 - 1); m <= std::min(B, m0 + 1); ++m)
        if (in(m)) return true;
    return false;
}

bool gram::range_writable(bool integer, double lo, bool lo_inc, double hi, bool hi_inc) {
    Node n;
    n.lo = lo, n.lo_inc = lo_inc, n.hi = hi, n.hi_inc = hi_inc;
    if (integer) {
        if (std::isfinite(lo)) n.lo = lo_inc ? std::ceil(lo) : std::floor(lo) + 1;
        if (std::isfinite(hi)) n.hi = hi_inc ? std::floor(hi) : std::ceil(hi) - 1;
        n.lo_inc = n.hi_inc = true;
    }
    // Every writable value is m / 10^j with |m| < 10^kBoundedDigits and j < kBoundedDigits
    // fraction digits ("0." + j digits keeps one integer digit); an integer has j = 0.
    double M = 1;
    for (uint32_t k = 0; k < kBoundedDigits; ++k) M *= 10;
    M -= 1;  // 999999999999999
    for (uint32_t j = 0; j < (integer ? 1 : kBoundedDigits); ++j)
        if (grid_hit(n, -M, M, j, false)) return true;
    return false;
}

std::shared_ptr<const Grammar> Grammar::compile(const std::vector<const JsonValue *> &tools,
                                                const GrammarOptions &opt) {
    auto g = std::make_shared<Grammar>();
    Compiler c(*g, opt);
    c.any_nodes();
    std::vector<Lit> calls;
    std::unordered_set<std::string_view> seen;  // linear in the tool count (a list search was quadratic)
    for (const JsonValue *t : tools) {
        const JsonValue *name = member(t, "name");
        if (!name || name->kind != JsonValue::Kind::String) continue;
        // [C] duplicate names keep the first definition for the grammar (§6.4).
        if (seen.count(name->text)) continue;
        const JsonValue *params = member(t, "parameters");
        // [C] no parameters, or non-object parameters: any JSON object.
        uint32_t node = (params && params->kind == JsonValue::Kind::Object) ? c.schema(params, 1) : c.any_object();
        if (!c.sat(node)) continue;  // [C] a tool whose required arguments cannot be written is unreachable
        if (g->nodes_[node].kind != Kind::Object && g->nodes_[node].kind != Kind::AnyObject) node = c.any_object();
        std::string lit = "{\"name\":";
        write_canonical_string(name->text, lit);
        lit += ",\"arguments\":";
        calls.push_back({std::move(lit), uint32_t(g->tool_names_.size())});
        g->tool_names_.push_back(name->text);
        seen.insert(name->text);
        g->tool_params_.push_back(node);
    }
    Node root;
    root.kind = Kind::Calls;
    root.single = g->tool_names_.size() == 1;
    // [C] tool_choice required with no reachable tool: "[]" stays (else no payload could close).
    root.require_call = opt.require_call && !g->tool_names_.empty();
    root.keys = c.litset(std::move(calls));
    g->root_ = c.add(std::move(root), true);
    return g;
}

// ---------------------------------------------------------------- post-decode checks

namespace {

bool check_format(const std::string &fmt, const std::string &s) {
    static const std::regex date(R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)");
    static const std::regex time(R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)$)");
    static const std::regex email(R"(^[^@\s]+@[^@\s]+\.[^@\s]+$)");
    static const std::regex uuid(R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)");
    static const std::regex ipv4(R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)");
    static const std::regex uri(R"(^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$)");
    if (fmt == "date") return std::regex_match(s, date);
    if (fmt == "time") return std::regex_match(s, time);
    if (fmt == "date-time") {
        const size_t t = s.find_first_of("Tt ");
        return t == 10 && std::regex_match(s.substr(0, 10), date) && std::regex_match(s.substr(11), time);
    }
    if (fmt == "email") return std::regex_match(s, email);
    if (fmt == "uuid") return std::regex_match(s, uuid);
    if (fmt == "ipv4") return std::regex_match(s, ipv4);
    if (fmt == "uri") return std::regex_match(s, uri);
    return true;  // [C] other formats are not checked
}

// Walks value v against node n; depth is bounded by the schema depth (kMaxSchemaDepth) since
// only schema-typed children are descended into.
std::string check(const Grammar &g, uint32_t ni, const JsonValue &v, const std::string &path) {
    const Node &n = g.nodes_[ni];
    using K = JsonValue::Kind;
    switch (n.kind) {
        case Kind::Union: {
            int cls = -1;
            switch (v.kind) {
                case K::String: cls = kStr; break;
                case K::Object: cls = kObj; break;
                case K::Array: cls = kArr; break;
                case K::Int: case K::Float: cls = kNum; break;
                case K::True: case K::False: cls = kBool; break;
                case K::Null: cls = kNull; break;
            }
            return cls >= 0 && n.by_class[cls] != kNone ? check(g, n.by_class[cls], v, path) : "";
        }
        case Kind::Object:
            if (v.kind != K::Object) return "";
            for (const auto &[key, val] : v.members)
                for (const Prop &p : n.props)
                    if (p.key == key) {
                        std::string r = check(g, p.node, val, path + "." + key);
                        if (!r.empty()) return r;
                    }
            return "";
        case Kind::Array:
            if (v.kind != K::Array) return "";
            if (n.unique) {
                std::vector<std::string> seen;
                for (const auto &it : v.items) {
                    std::string c = canonical(it);
                    if (std::find(seen.begin(), seen.end(), c) != seen.end())
                        return path + ": array items are not unique (uniqueItems)";
                    seen.push_back(std::move(c));
                }
            }
            for (size_t k = 0; k < v.items.size(); ++k) {
                std::string r = check(g, n.items, v.items[k], path + "[" + std::to_string(k) + "]");
                if (!r.empty()) return r;
            }
            return "";
        case Kind::String:
            if (v.kind != K::String) return "";
            if (!n.pattern.empty() && n.dfa == kNone) {
                // Fallback for the pattern (§6.4): ECMAScript search over the UTF-8 bytes.
                try {
                    const std::regex re(n.pattern, std::regex::ECMAScript);
                    if (v.text.size() > 4096 || !std::regex_search(v.text, re))
                        return path + ": value does not match pattern " + n.pattern;
                } catch (const std::exception &) {
                    return path + ": pattern " + n.pattern + " cannot be checked";
                }
            }
            if (!n.format.empty() && !check_format(n.format, v.text))
                return path + ": value is not a valid " + n.format;
            return "";
        case Kind::Number:
            if (n.multiple_of > 0 && (v.kind == K::Int || v.kind == K::Float)) {
                // Within a rounding tolerance of a whole quotient; a quotient that rounds to 0 only
                // for the value 0 (8e18 with multipleOf 1e300 is within 1e-9 of 0, not a multiple).
                const double q = v.number / n.multiple_of, r = std::round(q);
                if (!std::isfinite(q) || std::fabs(q - r) > 1e-9 * std::max(1.0, std::fabs(q)) ||
                    (r == 0 && v.number != 0))
                    return path + ": value is not a multiple of " + python_float_repr(n.multiple_of);
            }
            return "";
        default:
            return "";
    }
}

}  // namespace

std::string post_check(const Grammar &g, const JsonValue &calls) {
    if (calls.kind != JsonValue::Kind::Array) return "calls are not an array";
    for (size_t k = 0; k < calls.items.size(); ++k) {
        const JsonValue &c = calls.items[k];
        const JsonValue *name = c.find("name"), *args = c.find("arguments");
        if (!name || name->kind != JsonValue::Kind::String) return "call " + std::to_string(k) + " has no name";
        const auto it = std::find(g.tool_names_.begin(), g.tool_names_.end(), name->text);
        if (it == g.tool_names_.end()) return "call " + std::to_string(k) + " names an undeclared tool";
        if (!args) continue;
        try {
            std::string r = check(g, g.tool_params_[size_t(it - g.tool_names_.begin())], *args, name->text);
            if (!r.empty()) return r;
        } catch (const std::exception &e) {
            return name->text + ": check failed: " + e.what();  // std::regex_error, e.g. its stack limit
        }
    }
    return "";
}

}  // namespace chat
}  // namespace needle
