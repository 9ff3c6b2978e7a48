/* needle-bench: load time, prefill and decode throughput and peak memory of one model.
 *
 *   needle-bench --model FILE [--prompt-tokens N] [--decode-tokens M] [--threads T]
 *                [--chunk C] [--runs R] [--kv f32|int8] [--json]
 *
 * The prompt is a fixed pseudo-random token sequence (no tokenizer needed), prefilled through a
 * batch of C positions (C = 0: one position at a time); then M greedy decode steps. Figures are
 * medians over R runs, each on a fresh state. Uses only needle.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "needle.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static long arg_long(const char *flag, const char *s) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) {
        fprintf(stderr, "needle-bench: %s needs a non-negative integer, got '%s'\n", flag, s);
        exit(2);
    }
    return v;
}

static int die(const char *what, needle_status st) {
    fprintf(stderr, "needle-bench: %s: %s (%s)\n", what, needle_last_error(), needle_status_string(st));
    return 1;
}

static uint32_t argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

static void usage(FILE *f) {
    fprintf(f, "usage: needle-bench --model FILE [--prompt-tokens N] [--decode-tokens M] [--threads T] "
               "[--chunk C] [--runs R] [--kv f32|int8] [--json]\n");
}

int main(int argc, char **argv) {
    const char *path = NULL;
    long prompt_n = 512, decode_n = 128, threads = 0, chunk = 32, runs = 3;  /* chunk: needle.h */
    int json = 0;
    const char *kv = "f32";
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (i + 1 >= argc) { fprintf(stderr, "needle-bench: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) path = argv[++i];
        else if (!strcmp(a, "--prompt-tokens")) prompt_n = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--decode-tokens")) decode_n = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--threads")) threads = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--chunk")) chunk = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--runs")) runs = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--kv")) kv = argv[++i];
        else { fprintf(stderr, "needle-bench: unknown option %s\n", a); return 2; }
    }
    if (!path || runs < 1 || prompt_n < 1 || (strcmp(kv, "f32") && strcmp(kv, "int8"))) {
        usage(stderr);
        return 2;
    }

    needle_model_params mp;
    needle_model_params_init(&mp);
    mp.n_threads = threads > INT32_MAX ? INT32_MAX : (int32_t)threads;  /* the library clamps it */
    double *load = calloc((size_t)runs, sizeof(double)), *pre = calloc((size_t)runs, sizeof(double)),
           *dec = calloc((size_t)runs, sizeof(double));
    needle_model *model = NULL;
    for (long r = 0; r < runs; ++r) {  /* load time: median of R loads */
        needle_model *m = NULL;
        needle_model_free(model);  /* one model mapped at a time: the RSS is one session's */
        model = NULL;
        const double t0 = now_ms();
        needle_status st = needle_model_load_file(path, &mp, &m);
        load[r] = now_ms() - t0;
        if (st != NEEDLE_OK) return die(path, st);
        model = m;
    }
    needle_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    needle_model_get_info(model, &info);
    if ((uint64_t)prompt_n + (uint64_t)decode_n > info.max_seq_len) {
        fprintf(stderr, "needle-bench: %ld + %ld tokens exceed max_seq_len %u\n", prompt_n, decode_n, info.max_seq_len);
        return 2;
    }
    uint32_t *prompt = malloc(sizeof(uint32_t) * (size_t)prompt_n);
    float *logits = malloc(sizeof(float) * info.vocab_size);
    prompt[0] = info.bos_id;
    for (long i = 1; i < prompt_n; ++i)  /* fixed pseudo-random ids, skipping 0..13 (specials) */
        prompt[i] = 14 + (uint32_t)((i * 2654435761u) % (info.vocab_size > 14 ? info.vocab_size - 14 : 1));
    needle_batch *batch = NULL;
    if (chunk > 0) {
        needle_status st = needle_batch_create(model, (uint32_t)chunk, &batch);
        if (st != NEEDLE_OK) return die("batch", st);
    }
    for (long r = 0; r < runs; ++r) {
        needle_state *s = NULL;
        needle_state_params sp;
        needle_state_params_init(&sp);
        sp.kv_type = strcmp(kv, "int8") ? NEEDLE_KV_F32 : NEEDLE_KV_INT8;
        needle_status st = needle_state_create_ex(model, &sp, &s);
        if (st != NEEDLE_OK) return die("state", st);
        double t0 = now_ms();
        st = needle_state_prefill(s, batch, prompt, (size_t)prompt_n, logits, info.vocab_size);
        pre[r] = now_ms() - t0;
        if (st != NEEDLE_OK) return die("prefill", st);
        t0 = now_ms();
        for (long i = 0; i < decode_n; ++i) {
            st = needle_state_decode(s, argmax(logits, info.vocab_size), logits, info.vocab_size);
            if (st != NEEDLE_OK) return die("decode", st);
        }
        dec[r] = now_ms() - t0;
        needle_state_free(s);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double load_ms = median(load, (int)runs), prefill_ms = median(pre, (int)runs);
    const double decode_ms = median(dec, (int)runs);
    const double pre_tps = prompt_n / (prefill_ms / 1e3), dec_tps = decode_n ? decode_n / (decode_ms / 1e3) : 0.0;
    const long long rss = (long long)ru.ru_maxrss * 1024;
    if (json) {
        /* threads: what ran (needle_model_info.n_threads); isa_requested: NEEDLE_FORCE_ISA, refused
         * when it differs from isa */
        printf("{\"isa\":\"%s\",\"isa_requested\":\"%s\",\"threads\":%u,\"threads_requested\":%ld,\"chunk\":%ld,\"kv\":\"%s\",\"load_ms\":%.3f,\"prefill_tokens\":%ld,"
               "\"prefill_ms\":%.3f,\"prefill_tok_per_s\":%.1f,\"decode_tokens\":%ld,\"decode_ms\":%.3f,"
               "\"decode_tok_per_s\":%.1f,\"peak_rss_bytes\":%lld}\n",
               needle_kernel_isa(), needle_kernel_isa_requested(), info.n_threads, threads, chunk, kv, load_ms, prompt_n, prefill_ms, pre_tps, decode_n, decode_ms,
               dec_tps, rss);
    } else {
        printf("model %s (isa %s, threads %u, chunk %ld, kv %s, runs %ld)\n", path, needle_kernel_isa(), info.n_threads,
               chunk, kv, runs);
        if (info.n_threads != (unsigned long)threads && threads != 0)
            printf("threads  %ld requested, clamped to the %u this machine runs\n", threads, info.n_threads);
        if (*needle_kernel_isa_requested() && strcmp(needle_kernel_isa_requested(), needle_kernel_isa()))
            printf("isa      NEEDLE_FORCE_ISA=%s refused (unknown or not run here)\n", needle_kernel_isa_requested());
        printf("load     %8.3f ms\n", load_ms);
        printf("prefill  %8.1f ms  %5ld tokens  %8.1f tok/s\n", prefill_ms, prompt_n, pre_tps);
        printf("decode   %8.1f ms  %5ld tokens  %8.1f tok/s\n", decode_ms, decode_n, dec_tps);
        printf("peak RSS %8.1f MB\n", rss / 1048576.0);
    }
    needle_batch_free(batch);
    needle_model_free(model);
    free(prompt), free(logits), free(load), free(pre), free(dec);
    return 0;
}
