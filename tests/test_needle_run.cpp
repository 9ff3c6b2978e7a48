// needle-run (examples/needle_run.c, needle_run_chat.c), run as a child: flag values are parsed
// strictly (range, sign, trailing garbage) and a bad one is a usage error, exit 2, before any
// model work; --tools naming a directory says so. Built without the examples: nothing to test.
#include <doctest/doctest.h>

#ifdef NEEDLE_RUN

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

#include "child_util.h"
#include "fixtures.h"

namespace {

using Run = child_test::ChildResult;

// needle-run with `args`, fd 1 and 2 captured.
Run needle_run(const std::vector<std::string> &args) { return child_test::run_child(NEEDLE_RUN, args); }

}  // namespace

TEST_CASE("needle-run: bad numeric flag values are usage errors (exit 2) naming flag, range and value") {
    struct Bad { std::vector<std::string> args; std::string message; };
    const std::string u32 = "takes an integer from 1 to 4294967295, got '";
    const std::vector<Bad> bad{
        // 2^64 + ... wrapped to max_tokens 0 (an error after the model ran); -5 was taken.
        {{"--max-tokens", "99999999999999999999"}, "needle-run: --max-tokens " + u32 + "99999999999999999999'"},
        {{"--max-tokens", "-5"}, "needle-run: --max-tokens " + u32 + "-5'"},
        {{"--max-tokens", "4294967296"}, "needle-run: --max-tokens " + u32 + "4294967296'"},
        {{"--max-tokens", "0"}, "needle-run: --max-tokens " + u32 + "0'"},
        {{"--max-tokens", "12abc"}, "needle-run: --max-tokens " + u32 + "12abc'"},
        {{"--max-tokens", " 7"}, "needle-run: --max-tokens " + u32 + " 7'"},
        {{"--seed", "-1"}, "needle-run: --seed takes an integer from 0 to 18446744073709551615, got '-1'"},
        {{"--seed", "18446744073709551616"},
         "needle-run: --seed takes an integer from 0 to 18446744073709551615, got '18446744073709551616'"},
        {{"--top-k", "2.5"}, "needle-run: --top-k takes an integer from 0 to 2147483647, got '2.5'"},
        {{"--threads", "-2"}, "needle-run: --threads takes an integer from 0 to 2147483647, got '-2'"},
        {{"--temperature", "-0.5"}, "needle-run: --temperature takes a number >= 0, got '-0.5'"},
        {{"--temperature", "nan"}, "needle-run: --temperature takes a number >= 0, got 'nan'"},
        {{"--temperature", "1e999"}, "needle-run: --temperature takes a number >= 0, got '1e999'"},
        {{"--top-p", "0"}, "needle-run: --top-p takes a number in (0, 1], got '0'"},
        {{"--top-p", "1.01"}, "needle-run: --top-p takes a number in (0, 1], got '1.01'"},
    };
    for (const Bad &b : bad) {
        std::vector<std::string> args = b.args;
        args.push_back("hi");
        const Run r = needle_run(args);
        INFO(b.args[0] << " " << b.args[1] << " -> " << r.status << ": " << r.output);
        CHECK(r.status == 2);
        CHECK(r.output.find(b.message) != std::string::npos);
        CHECK(r.output.find("\"type\"") == std::string::npos);  // refused before any turn ran
    }
    // The extremes of the ranges are taken (the demo model's turn runs and prints its envelope;
    // plain generation on its file runs until the context is full and says so).
    const Run ok = needle_run({"--max-tokens", "4294967295", "hi"});
    INFO(ok.output);
    CHECK(ok.status == 0);
    CHECK(ok.output.find("\"type\": \"call\"") != std::string::npos);
    const Run plain = needle_run({"--model", NEEDLE_DEMO_MODEL, "--max-tokens", "4294967295", "--seed",
                                  "18446744073709551615", "--temperature", "0.7", "hi"});
    INFO(plain.output);
    CHECK(plain.status == 0);
    CHECK(plain.output.find(", stopped: context full\n") != std::string::npos);
}

TEST_CASE("needle-run: plain generation writes only the text to stdout, the figures to stderr") {
    // The figures line on stdout ended up inside a piped or redirected text.
    const std::string cmd = std::string("'") + NEEDLE_RUN + "' --model '" + NEEDLE_DEMO_MODEL +
                            "' --max-tokens 3 hi";
    const Run out = child_test::run_child("/bin/sh", {"-c", cmd + " 2>/dev/null"});
    INFO(out.output);
    CHECK(out.status == 0);
    CHECK(!out.output.empty());
    CHECK(out.output.back() == '\n');
    CHECK(out.output.find("[needle-run]") == std::string::npos);
    const Run err = child_test::run_child("/bin/sh", {"-c", cmd + " 2>&1 >/dev/null"});
    INFO(err.output);
    CHECK(err.status == 0);
    CHECK(err.output.rfind("[needle-run] prompt tokens ", 0) == 0);
    CHECK(err.output.find(", generated tokens 3, ") != std::string::npos);
    CHECK(err.output.find(", stopped: max tokens\n") != std::string::npos);
}

TEST_CASE("needle-run: a plain generation that fails prints its error line alone") {
    // It printed an empty line on stdout and a figures line ("prompt tokens 0 ... stopped: none")
    // after the error.
    const Run r = needle_run({"--model", NEEDLE_DEMO_MODEL, "\xff\xfe"});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.rfind("needle-run: generate: ", 0) == 0);
    CHECK(r.output.find("not valid UTF-8") != std::string::npos);
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    CHECK(r.output.find("[needle-run]") == std::string::npos);
}

TEST_CASE("needle-run: flags of the other mode are usage errors, -- ends the options") {
    // A tool-calling turn decodes greedily: sampling flags there were silently ignored, as
    // --system and --tool-choice were in plain generation.
    for (const char *flag : {"--temperature", "--top-k", "--top-p", "--seed"}) {
        const Run r = needle_run({flag, "1", "Set a timer for 5 minutes"});
        INFO(flag << " -> " << r.status << ": " << r.output);
        CHECK(r.status == 2);
        CHECK(r.output == std::string("needle-run: ") + flag +
                              " applies to plain generation (--model without --tools); a tool-calling "
                              "turn decodes greedily\n");
    }
    for (const char *flag : {"--system", "--tool-choice"}) {
        const Run r = needle_run({"--model", NEEDLE_DEMO_MODEL, flag, "none", "hi"});
        INFO(flag << " -> " << r.status << ": " << r.output);
        CHECK(r.status == 2);
        CHECK(r.output == std::string("needle-run: ") + flag +
                              " applies to a tool-calling turn (--tools, or no --model)\n");
    }
    // With --tools both --model and the turn's flags go together.
    Run r = needle_run({"--model", NEEDLE_DEMO_MODEL, "--tools", NEEDLE_MODELS_DIR "/needle-demo.tools.json", "--tool-choice", "none",
                        "Set a timer for 5 minutes"});
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("\"function_calls\": []") != std::string::npos);
    // "--" makes an argument that looks like an option the prompt (it was "unknown option").
    r = needle_run({"--max-tokens", "8", "--", "--x"});
    CHECK(r.status == 0);
    CHECK(r.output.find("\"type\": \"call\"") != std::string::npos);
    r = needle_run({"--", "--x", "y"});
    CHECK(r.status == 2);
    CHECK(r.output == "needle-run: more than one prompt given\n");
    r = needle_run({"hi", "--"});
    CHECK(r.status == 2);
    CHECK(r.output.rfind("usage: needle-run", 0) == 0);
}

TEST_CASE("needle-run: an unknown option is named as unknown, an option as a value is a missing value") {
    Run r = needle_run({"--hello"});
    CHECK(r.status == 2);
    CHECK(r.output.rfind("needle-run: unknown option --hello (", 0) == 0);  // was "--hello needs a value"
    r = needle_run({"--hello", "x", "hi"});
    CHECK(r.status == 2);
    CHECK(r.output.rfind("needle-run: unknown option --hello (", 0) == 0);
    r = needle_run({"--model", "--max-tokens", "5", "hi"});  // was "more than one prompt given"
    CHECK(r.status == 2);
    CHECK(r.output == "needle-run: --model needs a value\n");
    // A single-dash word was taken as the prompt ("-x" ran a turn on the text "-x").
    for (const char *opt : {"-x", "-model", "-5"}) {
        r = needle_run({opt, "hi"});
        CHECK(r.status == 2);
        CHECK(r.output.rfind(std::string("needle-run: unknown option ") + opt +
                                 " (a prompt that starts with '-' goes after --)\n", 0) == 0);
    }
    r = needle_run({"--", "-5 degrees"});
    CHECK(r.status == 0);
    r = needle_run({"hi", "--max-tokens"});
    CHECK(r.status == 2);
    CHECK(r.output == "needle-run: --max-tokens needs a value\n");
}

TEST_CASE("needle-run: --tools naming a FIFO with no writer fails at once (it blocked forever)") {
    char dir[] = "/tmp/needle-run-fifo.XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    const std::string fifo = std::string(dir) + "/tools";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const Run r = needle_run({"--tools", fifo, "hi"});
    unlink(fifo.c_str());
    rmdir(dir);
    CHECK(r.status == 1);
    CHECK(r.output == "needle-run: --tools " + fifo + ": cannot read it: No data available (a FIFO with no writer)\n");
}

TEST_CASE("needle-run: a tool-calling turn that fails prints its envelope and exits 1") {
    // One token cannot hold a call: the demo model's turn ends truncated (success:false). It
    // exited 0, so `needle-run ... && act` went on after a failed turn.
    const Run bad = needle_run({"--max-tokens", "1", "Set a timer for 5 minutes"});
    INFO(bad.output);
    CHECK(bad.status == 1);
    CHECK(bad.output.find("\"success\": false") != std::string::npos);
    CHECK(bad.output.find("\"error_code\": \"truncated\"") != std::string::npos);
    const Run good = needle_run({"Set a timer for 5 minutes"});
    INFO(good.output);
    CHECK(good.status == 0);
    CHECK(good.output.find("\"seconds\": 300") != std::string::npos);
}

TEST_CASE("needle-run: output that cannot be written and an endless --tools file fail (exit 1)") {
    // stdout on /dev/full: the envelope was lost but the run exited 0.
    const Run full = child_test::run_child("/bin/sh", {"-c", std::string("exec ") + NEEDLE_RUN + " 'Set a timer for 5 minutes' >/dev/full"});
    INFO(full.output);
    CHECK(full.status == 1);
    CHECK(full.output.find("writing the output failed") != std::string::npos);
    // /dev/zero as the tools list: read until memory ran out; now refused past 64 MiB.
    const Run zero = needle_run({"--tools", "/dev/zero", "hi"});
    INFO(zero.output);
    CHECK(zero.status == 1);
    CHECK(zero.output.find("more than 64 MiB") != std::string::npos);
}

TEST_CASE("needle-run: a model file that cannot be opened is named once, a damaged one by needle-run") {
    // Both read "needle-run: load: ..." (the damaged file's line had no "load:").
    // The library's message already names a path it cannot open; needle-run named it again.
    const Run missing = needle_run({"--model", "/nonexistent-dir/m.cact", "hi"});
    CHECK(missing.status == 1);
    CHECK(missing.output ==
          "needle-run: load: cannot open '/nonexistent-dir/m.cact': No such file or directory (i/o error)\n");
    // A damaged file: the library's message does not carry the path, needle-run adds it.
    char path[] = "/tmp/needle-run-damaged.XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, "garbage!", 8) == 8);
    close(fd);
    const Run damaged = needle_run({"--model", path, "hi"});
    unlink(path);
    INFO(damaged.output);
    CHECK(damaged.status == 1);
    CHECK(damaged.output.rfind("needle-run: load: " + std::string(path) + ": not a .cact file", 0) == 0);
    // the status in brackets last, without brackets of its own ("(invalid ... (a model file ...))")
    CHECK(damaged.output.find("(invalid or damaged model file or saved state)\n") != std::string::npos);
    CHECK(damaged.output.find("))") == std::string::npos);
}

TEST_CASE("needle-run: a --tools file with a NUL byte is refused naming its offset, a UTF-8 BOM is skipped") {
    // The library reads the tools as a C string: a NUL cut them ("invalid JSON ... unterminated
    // string"), and a byte order mark was "invalid JSON at byte 0".
    char path[] = "/tmp/needle-run-tools.XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const std::string nul("[{\"name\":\"x\0y\"}]", 16);
    REQUIRE(write(fd, nul.data(), nul.size()) == ssize_t(nul.size()));
    close(fd);
    const Run r = needle_run({"--tools", path, "hi"});
    CHECK(r.status == 1);
    CHECK(r.output == "needle-run: --tools " + std::string(path) + ": a NUL byte at offset 11 (JSON text has none)\n");
    FILE *f = std::fopen(path, "wb");
    REQUIRE(f != nullptr);
    std::fputs("\xEF\xBB\xBF[{\"name\":\"set_timer\",\"parameters\":{\"type\":\"object\",\"properties\":"
               "{\"seconds\":{\"type\":\"integer\"}},\"required\":[\"seconds\"]}}]",
               f);
    std::fclose(f);
    const Run bom = needle_run({"--tools", path, "--tool-choice", "required", "Set a timer for 5 minutes"});
    unlink(path);
    INFO(bom.output);
    CHECK(bom.status == 0);
    CHECK(bom.output.find("\"name\": \"set_timer\"") != std::string::npos);
}

TEST_CASE("needle-run: a chat that cannot be created names the cause first, then the tools it read") {
    // It was "needle-run: <tools file>: needle_chat_create: chat: system text is not valid UTF-8",
    // which blamed the tools file for --system's bytes.
    const std::string tools = NEEDLE_MODELS_DIR "/needle-demo.tools.json";
    const Run sys = needle_run({"--model", NEEDLE_DEMO_MODEL, "--tools", tools, "--system", "\xff", "hi"});
    CHECK(sys.status == 1);
    CHECK(sys.output == "needle-run: needle_chat_create: chat: system text is not valid UTF-8 (invalid argument; "
                        "tools: " + tools + ")\n");
    char path[] = "/tmp/needle-run-tools.XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, "[{\"name\":\"\"}]", 13) == 13);
    close(fd);
    const Run bad = needle_run({"--model", NEEDLE_DEMO_MODEL, "--tools", path, "hi"});
    unlink(path);
    CHECK(bad.status == 1);
    CHECK(bad.output == "needle-run: needle_chat_create: chat: tool 0 (\"\"): name: the name is empty (invalid "
                        "argument; tools: " + std::string(path) + ")\n");
}

TEST_CASE("needle-run: a turn that fills the context says which flag shortens it") {
    // The library's message ends "call reset" (a conversation's remedy), which a one-turn CLI user
    // cannot do. The random-weight fixture model never closes a call, so the turn runs into
    // max_seq_len.
    const Run r = needle_run({"--model", fixtures::v2("models/tiny.cact"), "--tools", NEEDLE_CHAT_TOOLS,
                              "--max-tokens", "100000", "hi"});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("\"error_code\": \"context_full\"") != std::string::npos);
    CHECK(r.output.find(" tokens without closing its call and filled the context (max_seq_len); rephrase the "
                        "query (--max-tokens N stops such a turn sooner)\n") != std::string::npos);
    // Within the budget the same turn ends truncated, without the hint.
    const Run t = needle_run({"--model", fixtures::v2("models/tiny.cact"), "--tools", NEEDLE_CHAT_TOOLS,
                              "--max-tokens", "8", "hi"});
    CHECK(t.output.find("\"error_code\": \"truncated\"") != std::string::npos);
    CHECK(t.output.find("without closing its call") == std::string::npos);
    // A query too long to start is context_full too, but no token was written: the envelope's own
    // message ("the query is too long ...") says it all, no hint.
    std::string longq;
    for (int i = 0; i < 2000; ++i) longq += "word ";
    const Run l = needle_run({"--model", fixtures::v2("models/tiny.cact"), "--tools", NEEDLE_CHAT_TOOLS, longq});
    INFO(l.output);
    CHECK(l.status == 1);
    CHECK(l.output.find("\"error_code\": \"context_full\"") != std::string::npos);
    CHECK(l.output.find("without closing its call") == std::string::npos);
}

TEST_CASE("needle-run: --tools naming a directory says so") {
    // It used to read as empty text: "invalid JSON at byte 0: expected a value".
    const Run r = needle_run({"--tools", "/tmp", "hi"});
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("needle-run: --tools /tmp: cannot read it: Is a directory (a JSON file of tool schemas is expected)") !=
          std::string::npos);
    CHECK(r.output.find("invalid JSON") == std::string::npos);
}

#endif  // NEEDLE_RUN
