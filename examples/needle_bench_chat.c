/* needle-bench --chat: the tool-calling layer's costs (needle.h only): needle_chat_create with 5
 * and 50 tools (first time, and from the tool index file: with 50 the retrieval embeds every
 * tool, spec §9), the static-prefix prefill of the first turn, and the grammar's cost per call
 * token next to the decode step's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "needle.h"
#include "needle_bench_chat.h"

static double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* n synthetic tools (malloc'd JSON): rich = an enum, a bounded integer and a bounded string each
 * (the grammar figure); else a bare name (so that 50 fit the synthetic needle2's 2,048 positions). */
static char *make_tools(int n, int rich) {
    const size_t cap = (size_t)n * 320 + 8;
    char *s = malloc(cap);
    size_t k = 0;
    s[k++] = '[';
    for (int i = 0; i < n; ++i)
        k += (size_t)snprintf(s + k, cap - k, !rich ? "%s{\"name\":\"t%d\"}" :
                              "%s{\"name\":\"tool_%d\",\"parameters\":{\"type\":\"object\",\"properties\":{"
                              "\"mode\":{\"type\":\"string\",\"enum\":[\"on\",\"off\"]},"
                              "\"level\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100},"
                              "\"note\":{\"type\":\"string\",\"maxLength\":12}},\"required\":[\"mode\"]}}",
                              i ? "," : "", i);
    s[k++] = ']';
    s[k] = '\0';
    return s;
}

/* Best time of `runs` needle_chat_create calls with `tools`; index_path NULL or the index file,
 * removed before every run when `fresh` (the first-time cost: every tool embedded, the file
 * written). The last chat is kept in *keep when keep is non-NULL. Returns -1 on failure. */
static double time_create(needle_model *model, const char *tools, const char *index_path, int fresh, int runs,
                          needle_chat **keep) {
    double best = 1e30;
    for (int r = 0; r < runs; ++r) {
        needle_chat_params cp;
        cp.struct_size = sizeof cp;
        needle_chat_params_init(&cp);
        cp.tool_choice = NEEDLE_TOOL_CHOICE_REQUIRED;
        cp.tool_index_path = index_path;
        if (fresh && index_path) remove(index_path);
        needle_chat *chat = NULL;
        const double t0 = ms_now();
        const needle_status st = needle_chat_create(model, "date: 2026-07-21", tools, &cp, &chat);
        const double dt = ms_now() - t0;
        if (st != NEEDLE_OK) {
            fprintf(stderr, "needle-bench: %s\n", needle_last_error());  /* names needle_chat_create */
            return -1;
        }
        if (dt < best) best = dt;
        if (keep && r == runs - 1) *keep = chat;
        else needle_chat_free(chat);
    }
    return best;
}

int bench_chat(needle_model *model, int runs, int json) {
    const int counts[2] = {5, 50};
    /* create: [count][0] first time (no index file yet), [count][1] from the index file */
    double create_ms[2][2] = {{0, 0}, {0, 0}}, first_prefill_ms[2] = {0, 0};
    uint32_t prefix_tokens[2] = {0, 0};
    double grammar_per_tok = 0, step_ms = 0;
    uint32_t call_tokens = 0, generated = 0;
    char index_path[64];
    snprintf(index_path, sizeof index_path, "/tmp/needle-bench-%ld.idx", (long)clock());
    char *env = malloc(65536);
    for (int c = 0; c < 3; ++c) {  /* 5 and 50 small tools, then 5 rich ones for the grammar */
        char *tools = make_tools(c < 2 ? counts[c] : 5, c == 2);
        needle_chat *chat = NULL;
        if (c < 2) {
            create_ms[c][0] = time_create(model, tools, index_path, 1, runs, NULL);
            if (create_ms[c][0] >= 0) create_ms[c][1] = time_create(model, tools, index_path, 0, runs, &chat);
        } else {
            time_create(model, tools, NULL, 0, 1, &chat);  /* chat stays NULL on failure */
        }
        if (!chat) {  /* the error is on stderr: no figures made of failures */
            free(tools);
            remove(index_path);
            free(env);
            return 1;
        }
        size_t len = 0;
        needle_chat_complete(chat, "Turn tool 3 on at level 40, note: kitchen", 64, env, 65536, &len);
        needle_chat_stats s;
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        needle_chat_last_stats(chat, &s);
        if (c < 2) {  /* with retrieval the prefix is the selection's, known after the turn */
            needle_chat_static_prefix_tokens(chat, &prefix_tokens[c]);
            first_prefill_ms[c] = s.prefill_ms;
        }
        if (c == 2 && s.call_tokens > 0 && s.generated_tokens > 0) {  /* the 5-tool turn */
            grammar_per_tok = s.grammar_ms / s.call_tokens;
            step_ms = (s.decode_ms - s.grammar_ms) / s.generated_tokens;
            call_tokens = s.call_tokens, generated = s.generated_tokens;
        }
        needle_chat_free(chat);
        free(tools);
    }
    remove(index_path);
    free(env);
    if (json) {
        printf("{\"isa\":\"%s\",\"chat_create_ms_5\":%.3f,\"chat_create_ms_50\":%.3f,"
               "\"chat_create_index_ms_5\":%.3f,\"chat_create_index_ms_50\":%.3f,\"prefix_tokens_5\":%u,"
               "\"prefix_tokens_50\":%u,\"first_prefill_ms_5\":%.1f,\"first_prefill_ms_50\":%.1f,"
               "\"grammar_ms_per_call_token\":%.4f,\"decode_step_ms\":%.4f,\"call_tokens\":%u,\"generated_tokens\":%u}\n",
               needle_kernel_isa(), create_ms[0][0], create_ms[1][0], create_ms[0][1], create_ms[1][1],
               prefix_tokens[0], prefix_tokens[1], first_prefill_ms[0], first_prefill_ms[1], grammar_per_tok, step_ms,
               call_tokens, generated);
    } else {
        printf("chat (isa %s, best of %d)\n", needle_kernel_isa(), runs);
        for (int c = 0; c < 2; ++c)
            printf("create   %8.3f ms first time, %8.3f ms from the index file  %2d tools%s  (static prefix %u "
                   "tokens, prefilled by the first turn in %.1f ms)\n",
                   create_ms[c][0], create_ms[c][1], counts[c],
                   counts[c] > NEEDLE_CHAT_RETRIEVAL_K ? " (retrieval: all embedded)" : "", prefix_tokens[c],
                   first_prefill_ms[c]);
        printf("grammar  %8.4f ms per call token (%u call tokens of %u)\n", grammar_per_tok, call_tokens, generated);
        printf("decode   %8.4f ms per step without the grammar  -> grammar/step %.2f%%\n", step_ms,
               step_ms > 0 ? 100.0 * grammar_per_tok / step_ms : 0.0);
    }
    return 0;
}
