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
#include <errno.h>
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
            "  --threads N      worker threads (default 0 = all cores; more than the cores are clamped)\n");
}

/* Parses a number argument; exits with a message on junk. */
static double number(const char *flag, const char *s) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "needle-run: %s needs a number, got '%s'\n", flag, s);
        exit(2);
    }
    return v;
}

static int fail(const char *what, needle_status st) {
    fprintf(stderr, "needle-run: %s: %s (%s)\n", what, needle_last_error(), needle_status_string(st));
    return 1;
}

int main(int argc, char **argv) {
    const char *model_path = NULL; /* NULL: the built-in demo model */
    const char *tools_path = NULL, *tools_text = NULL, *system = "";
    int tool_choice = NEEDLE_TOOL_CHOICE_AUTO, max_set = 0;
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
        if (a[0] == '-' && a[1] == '-' && a[2] && !has_value) {
            fprintf(stderr, "needle-run: %s needs a value\n", a);
            return 2;
        }
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
        else if (!strcmp(a, "--max-tokens")) { gp.max_tokens = (uint32_t)number(a, argv[++i]); max_set = 1; }
        else if (!strcmp(a, "--temperature")) gp.temperature = (float)number(a, argv[++i]);
        else if (!strcmp(a, "--top-k")) gp.top_k = (int32_t)number(a, argv[++i]);
        else if (!strcmp(a, "--top-p")) gp.top_p = (float)number(a, argv[++i]);
        else if (!strcmp(a, "--seed")) gp.seed = (uint64_t)number(a, argv[++i]);
        else if (!strcmp(a, "--threads")) {
            /* in int32 range (the library clamps it to the cores; it refuses a negative one) */
            const double t = number(a, argv[++i]);
            mp.n_threads = t >= (double)INT32_MAX ? INT32_MAX : t <= (double)INT32_MIN ? INT32_MIN : (int32_t)t;
        }
        else if (a[0] == '-' && a[1] == '-' && a[2]) { fprintf(stderr, "needle-run: unknown option %s\n", a); usage(stderr); return 2; }
        else if (!prompt) prompt = a;
        else { fprintf(stderr, "needle-run: more than one prompt given\n"); return 2; }
    }
    if (!prompt) { usage(stderr); return 2; }

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
    if (st != NEEDLE_OK) return fail(model_path ? model_path : "built-in model", st);
    if (tools_path || tools_text) {
        const int rc = run_chat(model, tools_path, tools_text, system, tool_choice,
                                max_set ? gp.max_tokens : 256, prompt);
        needle_model_free(model);
        return rc;
    }
    if ((st = needle_state_create(model, &state)) != NEEDLE_OK) return fail("state", st);
    if ((st = needle_batch_create(model, 32, &batch)) != NEEDLE_OK) {  /* needle.h: why 32 */
        /* a model with max_seq_len < 32: fall back to one position at a time */
        batch = NULL;
    }

    needle_generate_result res;
    memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    st = needle_generate(state, batch, prompt, strlen(prompt), &gp, on_token, NULL, &res);
    printf("\n");
    int rc = 0;
    if (st != NEEDLE_OK && st != NEEDLE_E_CANCELLED) rc = fail("generate", st);
    const double pre = res.prefill_ms > 0 ? res.prompt_tokens / (res.prefill_ms / 1000.0) : 0.0;
    const double dec = res.decode_ms > 0 ? res.generated_tokens / (res.decode_ms / 1000.0) : 0.0;
    printf("[needle-run] prompt tokens %u, generated tokens %u, prefill %.1f tok/s, decode %.1f tok/s\n", res.prompt_tokens, res.generated_tokens, pre, dec);
    needle_batch_free(batch);
    needle_state_free(state);
    needle_model_free(model);
    return rc;
}
