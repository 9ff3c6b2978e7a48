// §7.3 [C] call validation (validation.h has the rules and why).
#include "chat/validation.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace needle {
namespace chat {

namespace {

// Lowercase ASCII words; the apostrophes ' and U+2019 stay inside a word ("don't").
std::vector<std::string> words_of(std::string_view text) {
    std::vector<std::string> out;
    std::string w;
    for (size_t i = 0; i < text.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            w += char(c | 0x20);
            continue;
        }
        const bool curly = c == 0xE2 && text.substr(i, 3) == "\xE2\x80\x99";
        if ((c == '\'' || curly) && !w.empty()) {
            w += '\'';
            if (curly) i += 2;
            continue;
        }
        if (!w.empty()) out.push_back(std::move(w)), w.clear();
    }
    if (!w.empty()) out.push_back(std::move(w));
    return out;
}

// Value of an English number word below one hundred, or -1.
int small_number(const std::string &w) {
    static const char *const k0_19[] = {"zero",    "one",     "two",       "three",    "four",
                                        "five",    "six",     "seven",     "eight",    "nine",
                                        "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                        "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
    static const char *const kTens[] = {"twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};
    for (int k = 0; k < 20; ++k)
        if (w == k0_19[k]) return k;
    for (int k = 0; k < 8; ++k)
        if (w == kTens[k]) return 20 + 10 * k;
    return -1;
}

double scale_of(const std::string &w) {
    if (w == "hundred") return 100;
    if (w == "thousand") return 1e3;
    if (w == "million") return 1e6;
    return 0;
}

// Words that state a quantity without being a number ("Mute yourself." asks for level 0).
bool numeric_cue(const std::string &w) {
    static const char *const kCues[] = {"mute", "muted", "unmute", "silence", "half", "double", "twice",
                                        "once", "dozen", "max",   "maximum", "min",  "minimum"};
    for (const char *c : kCues)
        if (w == c) return true;
    return false;
}

bool is_digit(std::string_view t, size_t i) { return i < t.size() && t[i] >= '0' && t[i] <= '9'; }
// Exactly three digits at i, then no digit: the group after a thousands separator.
bool thousands_group(std::string_view t, size_t i) {
    return is_digit(t, i) && is_digit(t, i + 1) && is_digit(t, i + 2) && !is_digit(t, i + 3);
}

// Numbers written with digits: 90, 2.5, 1,000 (thousands groups), -3 (both signs recorded).
void digit_numbers(std::string_view t, StatedNumbers &s) {
    for (size_t i = 0; i < t.size();) {
        if (t[i] < '0' || t[i] > '9') { ++i; continue; }
        const bool minus = i > 0 && t[i - 1] == '-';
        std::string num;
        while (i < t.size()) {
            if (t[i] >= '0' && t[i] <= '9') num += t[i++];
            else if (t[i] == ',' && thousands_group(t, i + 1)) ++i;
            else break;
        }
        if (i + 1 < t.size() && t[i] == '.' && t[i + 1] >= '0' && t[i + 1] <= '9') {
            num += t[i++];
            while (i < t.size() && t[i] >= '0' && t[i] <= '9') num += t[i++];
        }
        const double v = std::strtod(num.c_str(), nullptr);
        s.values.push_back(v);
        if (minus) s.values.push_back(-v);
        s.any_cue = true;
    }
}

// Number words, alone and as runs ("twenty five", "one hundred and five", "two thousand").
void word_numbers(const std::vector<std::string> &words, StatedNumbers &s) {
    double total = 0, cur = 0;
    enum { kNone, kUnit, kTens, kScale } last = kNone;
    const auto end_run = [&] {
        if (last != kNone) s.values.push_back(total + cur);
        total = cur = 0;
        last = kNone;
    };
    for (const std::string &w : words) {
        if (numeric_cue(w)) s.any_cue = true;
        if (w == "dozen") s.values.push_back(12);
        const int v = small_number(w);
        const double sc = scale_of(w);
        if (v >= 0) {
            s.values.push_back(v);
            s.any_cue = true;
            // "twenty five" and "hundred (and) five" continue a run; "five five" starts a new one.
            if (!(last == kNone || last == kScale || (last == kTens && v < 10))) end_run();
            cur += v;
            last = v >= 20 ? kTens : kUnit;
        } else if (sc > 0) {
            s.values.push_back(sc);
            s.any_cue = true;
            const double base = last != kNone && cur != 0 ? cur : 1;
            if (sc == 100) cur = base * 100;
            else total += base * sc, cur = 0;
            last = kScale;
        } else if (w != "and" || last == kNone) {
            end_run();
        }
    }
    end_run();
}

bool is_negation(const std::string &w) {
    static const char *const kWords[] = {"not", "no", "never", "none", "nothing", "without", "cannot",
                                         "dont", "doesnt", "didnt", "wont", "cant", "isnt", "arent"};
    for (const char *k : kWords)
        if (w == k) return true;
    return w.size() > 3 && w.compare(w.size() - 3, 3, "n't") == 0;
}

struct Walk {
    const StatedNumbers &stated;
    std::vector<std::string> &ungrounded;
    bool grounded(double v) const {
        return std::find(stated.values.begin(), stated.values.end(), v) != stated.values.end();
    }
    // Flags `path` when `v` holds an ungrounded number; returns whether it did.
    bool value(const JsonValue &v, const std::string &path, uint32_t depth) {
        using K = JsonValue::Kind;
        bool bad = false;
        if (v.kind == K::Int || v.kind == K::Float) {
            bad = !grounded(v.number);
            if (bad && std::find(ungrounded.begin(), ungrounded.end(), path) == ungrounded.end())
                ungrounded.push_back(path);
        } else if (depth < JsonLimits{}.max_depth) {
            for (const auto &it : v.items) bad = value(it, path, depth + 1) || bad;
            for (const auto &[k, m] : v.members) bad = value(m, path + "." + k, depth + 1) || bad;
        }
        return bad;
    }
};

void append_item(std::string &arr, const std::string &item) {
    arr.insert(arr.size() - 1, arr.size() > 2 ? "," + item : item);
}

}  // namespace

StatedNumbers stated_numbers(std::string_view text) {
    StatedNumbers s;
    digit_numbers(text, s);
    word_numbers(words_of(text), s);
    return s;
}

bool states_negation(std::string_view text) {
    for (const std::string &w : words_of(text))
        if (is_negation(w)) return true;
    return false;
}

ValidationResult validate_calls(const JsonValue &calls, std::string_view user_text, ValidationMode mode) {
    ValidationResult r;
    r.function_calls = "[]";
    r.suppressed_calls = "[]";
    const StatedNumbers stated = stated_numbers(user_text);
    std::vector<std::string> ungrounded;
    Walk walk{stated, ungrounded};
    for (const JsonValue &call : calls.items) {
        const JsonValue *name = call.find("name"), *args = call.find("arguments");
        std::string first_bad;
        if (name && args)
            for (const auto &[k, v] : args->members) {
                const std::string path = name->text + "." + k;
                if (walk.value(v, path, 1) && first_bad.empty()) first_bad = path;
            }
        std::string text;
        write_canonical(call, text, true);  // the caller refused non-finite numbers; strict anyway
        if (mode == ValidationMode::Suppress && !first_bad.empty() && !stated.any_cue) {
            text.pop_back();  // '}' of {"name":...,"arguments":...}
            text += ",\"reason\":";
            write_canonical_string("ungrounded argument " + first_bad + ": the query states no number", text);
            text += '}';
            append_item(r.suppressed_calls, text);
        } else {
            append_item(r.function_calls, text);
        }
    }
    r.validation = "{\"ungrounded\":[";
    for (size_t k = 0; k < ungrounded.size(); ++k) {
        if (k) r.validation += ',';
        write_canonical_string(ungrounded[k], r.validation);
    }
    r.validation += "],\"negation\":";
    r.validation += states_negation(user_text) ? "true}" : "false}";
    return r;
}

}  // namespace chat
}  // namespace needle
