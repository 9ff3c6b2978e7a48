// The §7.3 serving layer (src/chat/validation.*): grounded numbers, negation, the validation
// field and suppression, unit-level and through needle_chat_complete with exact envelopes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "chat/json.h"
#include "chat/validation.h"
#include "chat_util.h"

using namespace needle::chat;
using namespace chat_test;

namespace {

bool states(const std::string &text, double v) {
    const StatedNumbers s = stated_numbers(text);
    return std::find(s.values.begin(), s.values.end(), v) != s.values.end();
}

ValidationResult run(const std::string &calls, const std::string &text, ValidationMode mode = ValidationMode::Suppress) {
    return validate_calls(parse_json(calls), text, mode);
}

// One tool whose only argument is forced: with tool_choice required the payload is fixed, so
// the envelope is exact whatever the random weights say.
const char kTimer[] =
    R"([{"name":"start_timer","parameters":{"type":"object","properties":{"seconds":{"type":"integer","enum":[86400]}},"required":["seconds"]}}])";

needle_chat_params with_validation(int32_t mode) {
    needle_chat_params p = params(NEEDLE_TOOL_CHOICE_REQUIRED);
    p.validation = mode;
    return p;
}

// The envelope with the three measured figures replaced by X (everything else is exact).
std::string masked(std::string env) {
    for (const char *key : {"\"confidence\":", "\"prefill_tps\":", "\"decode_tps\":", "\"peak_ram_mb\":"}) {
        const size_t at = env.find(key);
        REQUIRE(at != std::string::npos);
        const size_t b = at + std::strlen(key), e = env.find_first_of(",}", b);
        env.replace(b, e - b, "X");
    }
    return env;
}

const std::string kHead = R"({"type":"call","success":true,"error":null,"error_code":null,"reason":null,)";
const std::string kCall = R"({"name":"start_timer","arguments":{"seconds":86400}})";
const std::string kFigures = R"("reasoning":"","confidence":X,"prefill_tps":X,"decode_tps":X,"peak_ram_mb":X)";

}  // namespace

TEST_CASE("chat validation: numbers stated in digits and English words") {
    CHECK(states("a 90 second timer", 90));
    CHECK(states("raise it by 2.5", 2.5));
    CHECK(states("send 1,000 coins", 1000));
    CHECK(states("set it to -3", -3));
    CHECK(states("volume down to three", 3));
    CHECK(states("twenty-five degrees", 25));
    CHECK(states("one hundred and five", 105));
    CHECK(states("two thousand three hundred", 2300));
    CHECK(states("a dozen eggs", 12));
    // No unit arithmetic: "five minutes" grounds 5, not 300; "eleven" grounds 11, not 10.
    CHECK(states("five minutes", 5));
    CHECK_FALSE(states("five minutes", 300));
    CHECK_FALSE(states("eleven", 10));
    CHECK_FALSE(states("one hour", 60));
    CHECK_FALSE(stated_numbers("Set a timer.").any_cue);
    CHECK_FALSE(stated_numbers("temporizador de cinco minutos").any_cue);  // English words only
    CHECK(stated_numbers("Mute yourself.").any_cue);                       // a numeric cue, no value
    CHECK(stated_numbers("Mute yourself.").values.empty());
}

TEST_CASE("chat validation: negation words") {
    CHECK(states_negation("Don't set a timer"));
    CHECK(states_negation("don\xE2\x80\x99t set a timer"));  // U+2019 apostrophe
    CHECK(states_negation("do not call anyone"));
    CHECK(states_negation("never mind"));
    CHECK_FALSE(states_negation("Set a timer for nine minutes"));
    CHECK_FALSE(states_negation("know the note"));  // "no" / "not" only as whole words
}

TEST_CASE("chat validation: the official records' decisions (Needle 3 runner, spec 7.3)") {
    const std::string timer300 = R"([{"name":"start_timer","arguments":{"seconds":300}}])";
    // "Set a timer." -> 300: invented from nothing -> withheld with a reason.
    ValidationResult r = run(timer300, "Set a timer.");
    CHECK(r.function_calls == "[]");
    CHECK(r.suppressed_calls ==
          R"([{"name":"start_timer","arguments":{"seconds":300},"reason":"ungrounded argument start_timer.seconds: the query states no number"}])");
    CHECK(r.validation == R"({"ungrounded":["start_timer.seconds"],"negation":false})");
    // "five minutes" -> 300: ungrounded but the query states a number -> kept.
    r = run(timer300, "Set a timer for five minutes.");
    CHECK(r.function_calls == timer300);
    CHECK(r.suppressed_calls == "[]");
    CHECK(r.validation == R"({"ungrounded":["start_timer.seconds"],"negation":false})");
    // "Mute yourself." -> level 0: ungrounded, kept (numeric cue).
    r = run(R"([{"name":"set_volume","arguments":{"level":0}}])", "Mute yourself.");
    CHECK(r.function_calls == R"([{"name":"set_volume","arguments":{"level":0}}])");
    CHECK(r.validation == R"({"ungrounded":["set_volume.level"],"negation":false})");
    // Grounded and enum strings: nothing flagged.
    r = run(R"([{"name":"set_volume","arguments":{"level":3}},{"name":"play_animation","arguments":{"name":"dance"}}])",
            "volume down to three and dance");
    CHECK(r.function_calls ==
          R"([{"name":"set_volume","arguments":{"level":3}},{"name":"play_animation","arguments":{"name":"dance"}}])");
    CHECK(r.validation == R"({"ungrounded":[],"negation":false})");
}

TEST_CASE("chat validation: per call, nested paths, annotate mode") {
    const std::string calls =
        R"([{"name":"play_animation","arguments":{"name":"dance"}},{"name":"move","arguments":{"to":{"x":4,"y":[1,7]},"fast":true}}])";
    ValidationResult r = run(calls, "Dance, then move somewhere.");
    CHECK(r.function_calls == R"([{"name":"play_animation","arguments":{"name":"dance"}}])");
    CHECK(r.suppressed_calls ==
          R"([{"name":"move","arguments":{"to":{"x":4,"y":[1,7]},"fast":true},"reason":"ungrounded argument move.to: the query states no number"}])");
    CHECK(r.validation == R"({"ungrounded":["move.to.x","move.to.y"],"negation":false})");
    r = run(calls, "Dance, then move somewhere.", ValidationMode::Annotate);
    CHECK(r.function_calls == calls);
    CHECK(r.suppressed_calls == "[]");
    CHECK(r.validation == R"({"ungrounded":["move.to.x","move.to.y"],"negation":false})");
    r = run(R"([{"name":"move","arguments":{"to":{"x":4,"y":[1,7]}}}])", "go to 4, 1 and seven; don't run");
    CHECK(r.validation == R"({"ungrounded":[],"negation":true})");
}

TEST_CASE("chat validation: envelopes through needle_chat_complete") {
    // Off (the default): the call is returned, no validation field.
    Chat off = make_chat(tiny(), kTimer, params(NEEDLE_TOOL_CHOICE_REQUIRED));
    CHECK(masked(complete_text(off.get(), "Set a timer.", 64)) ==
          kHead + R"("function_calls":[)" + kCall + R"(],"suppressed_calls":[],)" + kFigures + "}");
    // Suppress: the invented 86400 is withheld, the turn still succeeds.
    Chat sup = make_chat(tiny(), kTimer, with_validation(NEEDLE_VALIDATION_SUPPRESS));
    CHECK(masked(complete_text(sup.get(), "Set a timer.", 64)) ==
          kHead + R"("function_calls":[],"suppressed_calls":[{"name":"start_timer","arguments":{"seconds":86400},)"
                  R"("reason":"ungrounded argument start_timer.seconds: the query states no number"}],)" +
              kFigures + R"(,"validation":{"ungrounded":["start_timer.seconds"],"negation":false}})");
    // Stated in digits: grounded and kept. (A withheld call makes no tool-result turn: the
    // next text is a fresh query after reset.)
    needle_chat_reset(sup.get());
    CHECK(masked(complete_text(sup.get(), "Time 86400 seconds, don't beep", 64)) ==
          kHead + R"("function_calls":[)" + kCall + R"(],"suppressed_calls":[],)" + kFigures +
              R"(,"validation":{"ungrounded":[],"negation":true}})");
    // Annotate: flagged but kept.
    Chat ann = make_chat(tiny(), kTimer, with_validation(NEEDLE_VALIDATION_ANNOTATE));
    CHECK(masked(complete_text(ann.get(), "Set a timer.", 64)) ==
          kHead + R"("function_calls":[)" + kCall + R"(],"suppressed_calls":[],)" + kFigures +
              R"(,"validation":{"ungrounded":["start_timer.seconds"],"negation":false}})");
}

TEST_CASE("chat validation: a struct without the field gets the default, bad values are refused") {
    needle_chat_params p = with_validation(NEEDLE_VALIDATION_SUPPRESS);
    p.struct_size = uint32_t(offsetof(needle_chat_params, validation));  // an older caller
    Chat old = make_chat(tiny(), kTimer, p);
    CHECK(masked(complete_text(old.get(), "Set a timer.", 64)) ==
          kHead + R"("function_calls":[)" + kCall + R"(],"suppressed_calls":[],)" + kFigures + "}");
    for (int32_t bad : {-1, 3}) {
        needle_status st;
        std::string msg;
        Chat c = try_chat(tiny(), kTimer, with_validation(bad), st, msg);
        CHECK(st == NEEDLE_E_INVALID_ARGUMENT);
        CHECK(c == nullptr);
        CHECK(msg == "needle_chat_create: validation " + std::to_string(bad) + " (use 0 off, 1 suppress, 2 annotate)");
    }
    needle_chat_params d;
    d.struct_size = sizeof d;
    needle_chat_params_init(&d);
    CHECK(d.validation == NEEDLE_VALIDATION_OFF);
}

TEST_CASE("chat: a call carrying NaN or Infinity is withheld and the envelope stays strict JSON") {
    // Python's json accepts NaN/Infinity in a schema, so an enum can force the grammar to emit
    // one (found by fuzz_chat). The envelope must stay RFC 8259 JSON: the call is refused as a
    // schema violation and shown in suppressed_calls with null in place of the number.
    const std::string fail = R"({"type":"call","success":false,"error":"the call carries a NaN or infinite number, )"
                             R"(which JSON cannot represent","error_code":"schema_violation","reason":"runtime_failure",)"
                             R"("function_calls":[],"suppressed_calls":)";
    for (const char *literal : {"NaN", "Infinity", "-Infinity"}) {
        CAPTURE(literal);
        const std::string tools = std::string(R"([{"name":"a","parameters":{"type":"object","properties":)") +
                                  R"({"w":{"type":"number","enum":[)" + literal + R"(]}},"required":["w"]}}])";
        for (int32_t mode : {NEEDLE_VALIDATION_OFF, NEEDLE_VALIDATION_SUPPRESS}) {
            Chat c = make_chat(tiny(), tools.c_str(), with_validation(mode));
            CHECK(masked(complete_text(c.get(), "Set it.", 64)) ==
                  fail + R"([{"name":"a","arguments":{"w":null}}],)" + kFigures + "}");
        }
    }
    // The writer itself: strict mode only changes non-finite numbers.
    std::string out;
    write_canonical(parse_json(R"([NaN,-Infinity,1.5,2,"NaN"])"), out, true);
    CHECK(out == R"([null,null,1.5,2,"NaN"])");
    out.clear();
    write_canonical(parse_json(R"([NaN,-Infinity,1.5])"), out);
    CHECK(out == "[NaN,-Infinity,1.5]");
    CHECK(has_non_finite(parse_json(R"({"a":[1,{"b":Infinity}]})")));
    CHECK_FALSE(has_non_finite(parse_json(R"({"a":[1,{"b":1e308}]})")));
}
