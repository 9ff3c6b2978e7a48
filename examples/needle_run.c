/* needle-run: stream generated text for a prompt, then one line of figures.
 *
 *   needle-run [--model FILE] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *              [--seed S] [--threads N] "prompt"
 *   needle-run [--model FILE] --tools FILE [--system TEXT] [--tool-choice auto|required|none]
 *              [--max-tokens N] "query"      one tool-calling turn: prints the JSON envelope
 *
 * Without --model it runs the demo model built into libneedle (needle_model_load_builtin: a
 * small model trained to call the four tools of models/needle-demo.tools.json) and, unless
 * --tools is given, one tool-calling turn with those tools: `needle-run "Set a timer for 5
 * minutes"` prints a set_timer call. A build without the built-in model loads the copy in the
 * build tree (NEEDLE_DEMO_MODEL) and the tools file beside it. Uses only needle.h. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"
#include "needle_run_chat.h"

#ifndef NEEDLE_DEMO_MODEL
#define NEEDLE_DEMO_MODEL "needle-demo.cact"
#endif
#ifndef NEEDLE_DEMO_TOOLS
#define NEEDLE_DEMO_TOOLS "needle-demo.tools.json"
#endif

static int on_token(uint32_t token, const char *text, size_t len, void *user) {
    (void)token;
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* rc, or 1 when stdout could not take the output (a full disk, a closed pipe): the envelope or
 * text was lost, so the run did not succeed. */
static int output_written(int rc) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "needle-run: writing the output failed: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}

/* The figures line of plain generation, on stderr like the errors: stdout carries only the
 * generated text, for a pipe or a file. */
static void print_figures(const needle_generate_result *res) {
    const double pre = res->prefill_ms > 0 ? res->prompt_tokens / (res->prefill_ms / 1000.0) : 0.0;
    const double dec = res->decode_ms > 0 ? res->generated_tokens / (res->decode_ms / 1000.0) : 0.0;
    static const char *const stops[] = {"none", "end of text", "max tokens", "context full", "cancelled"};
    const char *stop = res->stop_reason < sizeof stops / sizeof stops[0] ? stops[res->stop_reason] : "?";
    fprintf(stderr, "[needle-run] prompt tokens %u, generated tokens %u, prefill %.1f tok/s, decode %.1f tok/s, stopped: %s\n",
            res->prompt_tokens, res->generated_tokens, pre, dec, stop);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: needle-run [--model FILE] [--max-tokens N] [--temperature T] [--top-k K]\n"
            "                  [--top-p P] [--seed S] [--threads N] \"prompt\"\n"
            "       needle-run [--model FILE] --tools FILE [--system TEXT]\n"
            "                  [--tool-choice auto|required|none] [--max-tokens N] \"query\"\n"
            "  --model FILE     a Needle 2 or Needle 3 .cact container (default: the built-in demo\n"
            "                   model, run as a tool-calling turn with its tools)\n"
            "  --max-tokens N   tokens to generate (default 64)\n"
            "  --temperature T  0 = greedy (default); > 0 samples\n"
            "  --top-k K, --top-p P, --seed S   sampling controls\n"
            "  --tools FILE     a JSON array of tool schemas: run one tool-calling turn and print\n"
            "                   the response envelope (--max-tokens default 256 then)\n"
            "  --system TEXT    system facts for the tool-calling turn\n"
            "  --tool-choice C  auto (default), required or none\n"
            "  --threads N      worker threads (default 0 = all cores; more than the cores are clamped)\n"
            "  --               the next argument is the prompt, even if it starts with -\n"
            "A tool-calling turn decodes greedily: the sampling controls are for plain generation\n"
            "(--model without --tools), --system and --tool-choice for a turn; either misplaced is\n"
            "a usage error.\n"
            "Exit status: 0 done, 1 failed (a tool-calling turn whose envelope says success:false\n"
            "exits 1 after printing it), 2 usage error.\n");
}

/* Flag values are parsed strictly: a bad one is a usage error (exit 2), never a value cast
 * into range. (A cast wrapped 99999999999999999999 to max_tokens 0 and let -5 through.) */
static void bad_value(const char *flag, const char *s, const char *want) {
    fprintf(stderr, "needle-run: %s takes %s, got '%s' (see --help)\n", flag, want, s);
    exit(2);
}

/* A decimal integer in [lo, hi]. strtoull alone would skip leading spaces and accept "-5"
 * (negated into a huge value), so the first character must be a digit. */
static uint64_t integer(const char *flag, const char *s, uint64_t lo, uint64_t hi, const char *want) {
    char *end = NULL;
    errno = 0;
    const unsigned long long v = s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    if (!end || *end || errno == ERANGE || v < lo || v > hi) bad_value(flag, s, want);
    return (uint64_t)v;
}

/* A finite real in [lo, hi] (lo excluded if lo_open); no leading space, nan or inf. */
static float real(const char *flag, const char *s, double lo, int lo_open, double hi, const char *want) {
    char *end = NULL;
    errno = 0;
    const double v = s[0] && !isspace((unsigned char)s[0]) ? strtod(s, &end) : 0.0;
    if (!end || end == s || *end || errno == ERANGE || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi)
        bad_value(flag, s, want);
    return (float)v;
}

/* Whether `a` is one of the options that take a value (every option but --help). */
static int value_option(const char *a) {
    static const char *const names[] = {"--model", "--tools", "--system", "--tool-choice", "--max-tokens",
                                        "--temperature", "--top-k", "--top-p", "--seed", "--threads"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        if (!strcmp(a, names[i])) return 1;
    return 0;
}

static int fail(const char *what, needle_status st) {
    fprintf(stderr, "needle-run: %s: %s (%s)\n", what, needle_last_error(), needle_status_string(st));
    return 1;
}

int main(int argc, char **argv) {
    const char *model_path = NULL; /* NULL: the built-in demo model */
    const char *tools_path = NULL, *tools_text = NULL, *system = "";
    int tool_choice = NEEDLE_TOOL_CHOICE_AUTO, max_set = 0;
    /* flags of one mode only, named in a usage error when given in the other */
    const char *sampling_flag = NULL, *turn_flag = NULL;
    const char *prompt = NULL;
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 64;
    needle_model_params mp;
    mp.struct_size = sizeof mp;
    needle_model_params_init(&mp);

    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const int has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--")) {  /* end of options: "needle-run -- --x" */
            if (!has_value) { usage(stderr); return 2; }
            if (prompt || i + 2 < argc) { fprintf(stderr, "needle-run: more than one prompt given\n"); return 2; }
            prompt = argv[++i];
            break;
        }
        if (a[0] == '-' && a[1]) {
            /* Unknown before missing: "--hello" is not an option that lacks a value. A value
             * that is itself an option ("--model --max-tokens 5") is a missing value too. A
             * single-dash word ("-x") was taken as the prompt; a prompt that starts with '-'
             * goes after "--". */
            if (!value_option(a)) {
                fprintf(stderr, "needle-run: unknown option %s (a prompt that starts with '-' goes after --)\n", a);
                usage(stderr);
                return 2;
            }
            if (!has_value || value_option(argv[i + 1])) {
                fprintf(stderr, "needle-run: %s needs a value\n", a);
                return 2;
            }
        }
        if (!strcmp(a, "--temperature") || !strcmp(a, "--top-k") || !strcmp(a, "--top-p") || !strcmp(a, "--seed"))
            sampling_flag = a;
        if (!strcmp(a, "--system") || !strcmp(a, "--tool-choice")) turn_flag = a;
        if (!strcmp(a, "--model")) model_path = argv[++i];
        else if (!strcmp(a, "--tools")) tools_path = argv[++i];
        else if (!strcmp(a, "--system")) system = argv[++i];
        else if (!strcmp(a, "--tool-choice")) {
            const char *c = argv[++i];
            if (!strcmp(c, "auto")) tool_choice = NEEDLE_TOOL_CHOICE_AUTO;
            else if (!strcmp(c, "required")) tool_choice = NEEDLE_TOOL_CHOICE_REQUIRED;
            else if (!strcmp(c, "none")) tool_choice = NEEDLE_TOOL_CHOICE_NONE;
            else { fprintf(stderr, "needle-run: --tool-choice takes auto, required or none, got '%s'\n", c); return 2; }
        }
        /* The ranges are the library's (needle.h): a value it would refuse is refused here, as
         * a usage error, before the model loads. max_tokens 0 generates nothing (the chat
         * refuses it). n_threads above the cores is clamped by the library. */
        else if (!strcmp(a, "--max-tokens")) {
            gp.max_tokens = (uint32_t)integer(a, argv[++i], 1, UINT32_MAX, "an integer from 1 to 4294967295");
            max_set = 1;
        }
        else if (!strcmp(a, "--temperature")) gp.temperature = real(a, argv[++i], 0.0, 0, FLT_MAX, "a number >= 0");
        else if (!strcmp(a, "--top-k")) gp.top_k = (int32_t)integer(a, argv[++i], 0, INT32_MAX, "an integer from 0 to 2147483647");
        else if (!strcmp(a, "--top-p")) gp.top_p = real(a, argv[++i], 0.0, 1, 1.0, "a number in (0, 1]");
        else if (!strcmp(a, "--seed")) gp.seed = integer(a, argv[++i], 0, UINT64_MAX, "an integer from 0 to 18446744073709551615");
        else if (!strcmp(a, "--threads")) mp.n_threads = (int32_t)integer(a, argv[++i], 0, INT32_MAX, "an integer from 0 to 2147483647");
        else if (!prompt) prompt = a;
        else { fprintf(stderr, "needle-run: more than one prompt given\n"); return 2; }
    }
    if (!prompt) { usage(stderr); return 2; }
    /* A turn runs with --tools or on the built-in model (no --model); it decodes greedily, so a
     * sampling flag there would be silently ignored, as --system and --tool-choice would be in
     * plain generation: both are refused instead. */
    const int turn = tools_path != NULL || model_path == NULL;
    if (turn && sampling_flag) {
        fprintf(stderr, "needle-run: %s applies to plain generation (--model without --tools); "
                        "a tool-calling turn decodes greedily\n", sampling_flag);
        return 2;
    }
    if (!turn && turn_flag) {
        fprintf(stderr, "needle-run: %s applies to a tool-calling turn (--tools, or no --model)\n", turn_flag);
        return 2;
    }

    needle_model *model = NULL;
    needle_state *state = NULL;
    needle_batch *batch = NULL;
    needle_status st;
    if (model_path) st = needle_model_load_file(model_path, &mp, &model);
    else if ((st = needle_model_load_builtin(&mp, &model)) == NEEDLE_OK) {
        if (!tools_path) tools_text = needle_builtin_tools_json();
    } else if (st == NEEDLE_E_UNSUPPORTED) { /* built without it: the build tree's copy */
        model_path = NEEDLE_DEMO_MODEL;
        if (!tools_path) tools_path = NEEDLE_DEMO_TOOLS;
        st = needle_model_load_file(model_path, &mp, &model);
    }
    if (st != NEEDLE_OK) {
        /* Every load error reads "load: ..."; the library's message names the path when it
         * could not open the file, so the path is added only when it does not. */
        char what[512];
        if (!model_path) snprintf(what, sizeof what, "load: built-in model");
        else if (strstr(needle_last_error(), model_path)) snprintf(what, sizeof what, "load");
        else snprintf(what, sizeof what, "load: %s", model_path);
        return fail(what, st);
    }
    if (tools_path || tools_text) {
        const int rc = run_chat(model, tools_path, tools_text, system, tool_choice,
                                max_set ? gp.max_tokens : 256, prompt);
        needle_model_free(model);
        return output_written(rc);
    }
    /* Plain generation never asks for the confidence or the embedding: skip their pooling. */
    needle_state_params sp;
    sp.struct_size = sizeof sp;
    needle_state_params_init(&sp);
    sp.probe_heads = 0;
    if ((st = needle_state_create_ex(model, &sp, &state)) != NEEDLE_OK) return fail("state", st);
    if ((st = needle_batch_create(model, 32, &batch)) != NEEDLE_OK) {  /* needle.h: why 32 */
        /* a model with max_seq_len < 32: fall back to one position at a time */
        batch = NULL;
    }

    needle_generate_result res;
    memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    st = needle_generate(state, batch, prompt, strlen(prompt), &gp, on_token, NULL, &res);
    if (res.generated_tokens > 0) printf("\n");  /* ends the streamed text */
    const int failed = st != NEEDLE_OK && st != NEEDLE_E_CANCELLED;
    const int rc = failed ? fail("generate", st) : 0;
    if (!failed) print_figures(&res);  /* a failed run: its error line alone */
    needle_batch_free(batch);
    needle_state_free(state);
    needle_model_free(model);
    return output_written(rc);
}
