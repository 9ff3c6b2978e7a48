// Strict tools-list checks at create (tool_checks.h has the rules and why).
#include "chat/tool_checks.h"

#include <cmath>
#include <regex>
#include <string>

#include "chat/grammar.h"
#include "chat/grammar_regex.h"
#include "core/error.h"

namespace needle {
namespace chat {

namespace {

const JsonValue *member(const JsonValue &s, const char *key) { return s.find(key); }
const JsonValue *number_member(const JsonValue &s, const char *key) {
    const JsonValue *v = s.find(key);
    return v && (v->kind == JsonValue::Kind::Int || v->kind == JsonValue::Kind::Float) && !std::isnan(v->number)
               ? v : nullptr;
}

// A pattern quoted in a message, cut to a readable length.
std::string quoted(const std::string &p) {
    return "\"" + (p.size() > 80 ? p.substr(0, 80) + "..." : p) + "\"";
}

// Group nesting of a pattern (escapes and class contents skipped).
size_t nesting(const std::string &p) {
    size_t depth = 0, worst = 0;
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == '\\') { ++i; continue; }
        if (in_class) { in_class = p[i] != ']'; continue; }
        if (p[i] == '[') in_class = true;
        else if (p[i] == '(') worst = std::max(worst, ++depth);
        else if (p[i] == ')' && depth > 0) --depth;
    }
    return worst;
}

class Checker {
public:
    Checker(const JsonValue &tool, size_t index) : tool_(tool), index_(index) {}

    [[noreturn]] void refuse(const std::string &path, const std::string &problem) const {
        const JsonValue *name = tool_.find("name");
        std::string n;
        write_canonical_string(name ? name->text : "", n);
        fail(NEEDLE_E_INVALID_ARGUMENT, strf("chat: tool %zu (%s): %s: %s", index_, n.c_str(), path.c_str(), problem.c_str()));
    }

    void schema(const JsonValue &s, const std::string &path, uint32_t depth) const {
        if (s.kind != JsonValue::Kind::Object || depth > gram::kMaxSchemaDepth) return;
        if (const JsonValue *e = member(s, "enum"); e && e->kind == JsonValue::Kind::Array && e->items.empty())
            refuse(path, "\"enum\" is empty: no value can be written");
        range(s, path);
        counts(s, path, "minLength", "maxLength");
        counts(s, path, "minItems", "maxItems");
        if (const JsonValue *p = member(s, "pattern"); p && p->kind == JsonValue::Kind::String) pattern(s, p->text, path);
        if (const JsonValue *props = member(s, "properties"); props && props->kind == JsonValue::Kind::Object)
            for (const auto &[key, sub] : props->members) schema(sub, path + ".properties." + key, depth + 1);
        if (const JsonValue *items = member(s, "items")) schema(*items, path + ".items", depth + 1);
    }

private:
    void counts(const JsonValue &s, const std::string &path, const char *lo_key, const char *hi_key) const {
        const JsonValue *lo = number_member(s, lo_key), *hi = number_member(s, hi_key);
        if (lo && hi && lo->number > hi->number)
            refuse(path, strf("%s %s > %s %s", lo_key, lo->text.c_str(), hi_key, hi->text.c_str()));
    }

    // minimum / exclusiveMinimum / maximum / exclusiveMaximum leave no value (no integer for
    // "type": "integer"). The tighter bound wins, as in the grammar compiler.
    void range(const JsonValue &s, const std::string &path) const {
        double lo = -HUGE_VAL, hi = HUGE_VAL;
        bool lo_inc = true, hi_inc = true;
        std::string desc;
        const auto bound = [&](const char *key, bool low, bool inc) {
            const JsonValue *v = number_member(s, key);
            if (!v) return;
            desc += (desc.empty() ? "" : ", ") + std::string(key) + " " + v->text;
            double &b = low ? lo : hi;
            bool &bi = low ? lo_inc : hi_inc;
            if (low ? (v->number > b || (v->number == b && !inc)) : (v->number < b || (v->number == b && !inc)))
                b = v->number, bi = inc;
        };
        bound("minimum", true, true);
        bound("exclusiveMinimum", true, false);
        bound("maximum", false, true);
        bound("exclusiveMaximum", false, false);
        bool empty = lo > hi || (lo == hi && !(lo_inc && hi_inc));
        const JsonValue *t = member(s, "type");
        if (!empty && t && t->kind == JsonValue::Kind::String && t->text == "integer" && std::isfinite(lo) &&
            std::isfinite(hi)) {
            const double ilo = lo_inc ? std::ceil(lo) : std::floor(lo) + 1;
            const double ihi = hi_inc ? std::floor(hi) : std::ceil(hi) - 1;
            empty = ilo > ihi;
        }
        if (empty) refuse(path, "the range " + desc + " admits no value");
        multiple(s, path, lo, hi, desc);
        // A non-empty range the grammar cannot write a value of (grammar.h: range_writable):
        // the grammar drops that type, so every call needing it would be unreachable, and the
        // author would never learn why. Only where the grammar compiles this schema as a
        // number: "enum" / "const" take precedence over "type" (§6.4), and without a numeric
        // type the range is not enforced at all.
        if (desc.empty() || member(s, "enum") || member(s, "const")) return;
        bool has_integer = false, has_number = false;
        const auto note = [&](const JsonValue &v) {
            if (v.kind != JsonValue::Kind::String) return;
            has_integer = has_integer || v.text == "integer";
            has_number = has_number || v.text == "number";
        };
        if (t && t->kind == JsonValue::Kind::Array)
            for (const auto &v : t->items) note(v);
        else if (t)
            note(*t);
        if (!has_integer && !has_number) return;
        const bool integer = !has_number;  // the grammar compiles ["integer","number"] as number
        if (!gram::range_writable(integer, lo, lo_inc, hi, hi_inc))
            refuse(path, "the range " + desc + " admits no " + (integer ? "integer" : "number") +
                             " the grammar can write (at most " + std::to_string(gram::kBoundedDigits) +
                             " digits, no exponent: magnitude below 1e15" + (integer ? "" : ", steps of 1e-14") +
                             ")");
    }

    // "multipleOf" must be a number > 0 (JSON Schema); with a finite range it must leave some
    // multiple in it. The grammar does not enforce it (§6.4: checked after decoding), so such a
    // schema failed every call with schema_violation. Bounds are taken inclusively and with the
    // post-decode check's tolerance: only a range that clearly holds no multiple is refused.
    void multiple(const JsonValue &s, const std::string &path, double lo, double hi, const std::string &desc) const {
        const JsonValue *m = member(s, "multipleOf");
        if (!m) return;
        const JsonValue *num = number_member(s, "multipleOf");
        if (!num || !(num->number > 0) || !std::isfinite(num->number))
            refuse(path, "\"multipleOf\" must be a number greater than 0");
        if (!std::isfinite(lo) || !std::isfinite(hi)) return;
        const double a = lo / num->number, b = hi / num->number;
        if (!std::isfinite(a) || !std::isfinite(b)) return;
        const double tol = 1e-9 * std::max(1.0, std::max(std::fabs(a), std::fabs(b)));
        if (std::floor(b + tol) < std::ceil(a - tol))
            refuse(path, "the range " + desc + " holds no multiple of " + num->text);
    }

    void pattern(const JsonValue &s, const std::string &p, const std::string &path) const {
        if (p.size() > kMaxPatternBytes)
            refuse(path, strf("\"pattern\" of %zu bytes (at most %zu)", p.size(), kMaxPatternBytes));
        if (nesting(p) > kMaxPatternNesting)
            refuse(path, strf("\"pattern\" nests groups %zu deep (at most %zu)", nesting(p), kMaxPatternNesting));
        PatternDfa dfa;
        std::string why;
        if (compile_pattern(p, dfa, &why)) {
            const uint32_t d0 = dfa.mindist[dfa.start];
            if (d0 == UINT32_MAX) refuse(path, "\"pattern\" " + quoted(p) + " matches no string");
            const JsonValue *mx = number_member(s, "maxLength");
            if (mx && double(d0) > mx->number)
                refuse(path, "no string of at most maxLength " + mx->text + " code points matches \"pattern\" " + quoted(p));
            return;
        }
        // A count the grammar cannot enforce (grammar_regex.h: kMaxPatternRepeat); std::regex
        // would wrap it past 32 bits or refuse it as "not valid", which it is.
        if (!why.empty()) refuse(path, "\"pattern\" " + quoted(p) + ": " + why);
        // Outside our subset: valid ECMAScript is checked after decoding (§6.4); invalid never passes.
        try {
            const std::regex re(p, std::regex::ECMAScript);
            (void)re;
        } catch (const std::exception &) {
            refuse(path, "\"pattern\" " + quoted(p) + " is not a valid regular expression");
        }
    }

    const JsonValue &tool_;
    size_t index_;
};

}  // namespace

void check_tool_strict(const JsonValue &tool, size_t index) {
    const Checker c(tool, index);
    const JsonValue *name = tool.find("name");
    if (name && name->kind == JsonValue::Kind::String && name->text.empty()) c.refuse("name", "the name is empty");
    if (const JsonValue *params = tool.find("parameters")) c.schema(*params, "parameters", 1);
}

}  // namespace chat
}  // namespace needle
