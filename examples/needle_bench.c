/* needle-bench: load time, prefill and decode throughput and peak memory of one model.
 *
 *   needle-bench --model FILE [--prompt-tokens N] [--decode-tokens M] [--threads T]
 *                [--chunk C] [--runs R] [--kv f32|int8] [--isa NAME|all] [--depth D]
 *                [--max-tokens M] [--sequences S] [--json]
 *
 * The prompt is a fixed pseudo-random token sequence (no tokenizer needed), prefilled through a
 * batch of C positions (C = 0: one position at a time); then M greedy decode steps. Figures are
 * medians over R runs, each on a fresh state. Uses only needle.h.
 *
 * --sequences S > 1: S states are prefilled with the prompt one after the other (prefill figures:
 * the first one), then decoded together, M steps of needle_decode_many over all S (the batch of
 * the prefill serves as its scratch when C >= S); decode tok/s is the aggregate S*M / time.
 *
 * --isa NAME runs the kernels of that instruction set (as NEEDLE_FORCE_ISA=NAME does); --isa all
 * runs this program once per ISA the CPU and the library have (avx512, avx2, sse4_2, neon,
 * scalar) and prints them side by side (--json: one object per ISA, one a line). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "needle.h"
#include "needle_bench_chat.h"

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

/* Greedy pick, timed with the decode step: the first index of the largest logit. Eight running
 * maxima, merged at the end: one chain of compares over needle2's 8,192 logits took ~3 % of a
 * decode step (perf); this is the same index for finite logits. */
static uint32_t argmax(const float *v, uint32_t n) {
    enum { L = 8 };
    if (n < 2 * L) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; ++i)
            if (v[i] > v[best]) best = i;
        return best;
    }
    float m[L];
    uint32_t at[L];
    for (uint32_t j = 0; j < L; ++j) m[j] = v[j], at[j] = j;
    uint32_t i = L;
    for (; i + L <= n; i += L)
        for (uint32_t j = 0; j < L; ++j)
            if (v[i + j] > m[j]) m[j] = v[i + j], at[j] = i + j;
    for (; i < n; ++i)
        if (v[i] > m[i % L]) m[i % L] = v[i], at[i % L] = i;
    uint32_t best = at[0];
    for (uint32_t j = 1; j < L; ++j)
        if (m[j] > v[best] || (m[j] == v[best] && at[j] < best)) best = at[j];
    return best;
}

static void usage(FILE *f) {
    fprintf(f, "usage: needle-bench --model FILE [--prompt-tokens N] [--decode-tokens M] [--threads T] "
               "[--chunk C] [--runs R] [--kv f32|int8] [--isa NAME|all] [--depth D] [--max-tokens M] [--sequences S] [--precision exact|fast] [--probe-heads on|off] [--json] [--chat]\n"
               "  --model FILE: the .cact model to measure (required)\n"
               "  --prompt-tokens N, --decode-tokens M: prompt prefilled, then tokens decoded greedily (512, 128;\n"
               "          left unset, the prompt shrinks to fit a model whose max_seq_len is smaller)\n"
               "  --threads T: needle_model_params.n_threads (0: every core)\n"
               "  --chunk C: positions per prefill batch (32; 0: prefill one position at a time)\n"
               "  --runs R: runs per figure, 1..1000 (3); the figures are medians\n"
               "  --kv f32|int8: the KV cache's type (needle_state_params.kv_type)\n"
               "  --isa NAME|all: force a kernel ISA (NEEDLE_FORCE_ISA; one this CPU or build lacks falls back\n"
               "          to the best, said on stderr), or run every ISA of this CPU side by side\n"
               "  --depth D: Needle 3 depth rung (needle_model_params.depth; 0: all layers)\n"
               "  --max-tokens M: the state's max_tokens (default: prompt + decode tokens)\n"
               "  --sequences S: decode S states at once through needle_decode_many (aggregate tok/s)\n"
               "  --precision exact|fast: needle_model_params.precision (fast: int8 activations)\n"
               "  --probe-heads off: states skip the probe-head pooling (needle_state_params.probe_heads 0)\n"
               "  --json: one JSON line instead of the table\n"
               "  --chat: tool-calling figures instead: needle_chat_create with 5 and 50 tools (first time and\n"
               "          from the tool index file), the grammar's\n"
               "          cost per call token next to the decode step's\n");
}

/* One child run of this program under NEEDLE_FORCE_ISA=isa with --json; its JSON line in out.
 * Returns 0 on success. */
static int run_child(char **argv, int argc, const char *isa, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        char **args = calloc((size_t)argc + 2, sizeof(char *));
        int n = 0;
        for (int i = 0; i < argc; ++i) {
            if (!strcmp(argv[i], "--isa")) { ++i; continue; }
            if (!strcmp(argv[i], "--json")) continue;
            args[n++] = argv[i];
        }
        args[n++] = "--json";
        args[n] = NULL;
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        setenv("NEEDLE_FORCE_ISA", isa, 1);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)r;
    out[len] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static double json_num(const char *js, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    return p ? atof(p + strlen(pat)) : 0.0;
}

/* --isa all: every ISA whose forced run reports that ISA (a CPU that cannot run it falls back). */
static int run_all_isas(int argc, char **argv, int json, const char *precision) {
    static const char *const isas[] = {"avx512", "avx2", "sse4_2", "neon", "scalar"};
    char buf[4096], want[64];
    int shown = 0;
    if (!json)
        printf("%-8s %-9s %10s %14s %14s %10s\n", "isa", "precision", "load ms", "prefill tok/s", "decode tok/s",
               "RSS MB");
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; ++i) {
        if (run_child(argv, argc, isas[i], buf, sizeof buf) != 0) {
            fprintf(stderr, "needle-bench: the %s run failed\n", isas[i]);
            return 1;
        }
        snprintf(want, sizeof want, "\"isa\":\"%s\"", isas[i]);
        if (!strstr(buf, want)) continue; /* not run by this CPU or not built */
        ++shown;
        if (json) fputs(buf, stdout);
        else
            printf("%-8s %-9s %10.3f %14.1f %14.1f %10.1f\n", isas[i], precision, json_num(buf, "load_ms"),
                   json_num(buf, "prefill_tok_per_s"), json_num(buf, "decode_tok_per_s"),
                   json_num(buf, "peak_rss_bytes") / 1048576.0);
        fflush(stdout);
    }
    return shown ? 0 : 1;
}

/* 0 once stdout is written out, else 1 with a line on stderr (a full disk, a closed pipe). */
static int flushed_stdout(void) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    fprintf(stderr, "needle-bench: writing the output failed: %s\n", strerror(errno));
    return 1;
}

/* Resident bytes of this process now (/proc/self/statm), 0 where unavailable. */
static long long resident_bytes(void) {
    long long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    long prompt_n = 512, decode_n = 128, threads = 0, chunk = 32, runs = 3;  /* chunk: needle.h */
    long depth = 0, max_tokens = -1;  /* -1: prompt + decode tokens */
    long sequences = 1;
    int json = 0, chat = 0, sized = 0;  /* sized: --prompt-tokens or --decode-tokens given */
    const char *kv = "f32", *isa = NULL, *precision = "exact", *probe_heads = "on";
    static const char *const with_value[] = {"--model", "--prompt-tokens", "--decode-tokens", "--threads", "--chunk",
                                             "--runs", "--kv", "--isa", "--depth", "--max-tokens", "--sequences",
                                             "--precision", "--probe-heads"};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; ++k) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "needle-bench: unknown option %s (--help lists them)\n", a);
            return 2;
        }
        if (i + 1 >= argc) { fprintf(stderr, "needle-bench: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) path = argv[++i];
        else if (!strcmp(a, "--prompt-tokens")) prompt_n = arg_long(a, argv[++i]), sized = 1;
        else if (!strcmp(a, "--decode-tokens")) decode_n = arg_long(a, argv[++i]), sized = 1;
        else if (!strcmp(a, "--threads")) threads = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--chunk")) chunk = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--runs")) runs = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--kv")) kv = argv[++i];
        else if (!strcmp(a, "--isa")) isa = argv[++i];
        else if (!strcmp(a, "--depth")) depth = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--max-tokens")) max_tokens = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--sequences")) sequences = arg_long(a, argv[++i]);
        else if (!strcmp(a, "--precision")) precision = argv[++i];
        else probe_heads = argv[++i];  /* --probe-heads, the last of with_value */
    }
    /* One line saying which argument is wrong, then the usage. */
    const char *bad = !path ? "--model FILE is required"
                      : runs < 1 || runs > 1000 ? "--runs must be 1..1000"
                      : prompt_n < 1 ? "--prompt-tokens must be at least 1"
                      : sequences < 1 || sequences > 4096 ? "--sequences must be 1..4096"
                      : chunk > (long)UINT32_MAX ? "--chunk must be 0..4294967295"
                      : max_tokens > (long)UINT32_MAX ? "--max-tokens must be 0..4294967295"
                      : depth > (long)UINT32_MAX ? "--depth must be 0..4294967295"
                      : strcmp(kv, "f32") && strcmp(kv, "int8") ? "--kv must be f32 or int8"
                      : strcmp(precision, "exact") && strcmp(precision, "fast") ? "--precision must be exact or fast"
                      : strcmp(probe_heads, "on") && strcmp(probe_heads, "off") ? "--probe-heads must be on or off"
                      : NULL;
    if (bad) {
        fprintf(stderr, "needle-bench: %s\n", bad);
        usage(stderr);
        return 2;
    }
    if (isa && !strcmp(isa, "all")) return run_all_isas(argc, argv, json, precision);
    if (isa) setenv("NEEDLE_FORCE_ISA", isa, 1); /* read at the library's first kernel call */
    if (isa && strcmp(needle_kernel_isa(), isa)) /* the library falls back to the best ISA */
        fprintf(stderr, "needle-bench: --isa %s is not in this build or not run by this CPU: running %s\n", isa,
                needle_kernel_isa());

    needle_model_params mp;
    mp.struct_size = sizeof mp;
    needle_model_params_init(&mp);
    mp.n_threads = threads > INT32_MAX ? INT32_MAX : (int32_t)threads;  /* the library clamps it */
    mp.depth = (uint32_t)depth; /* Needle 3 ladder rung (range checked above) */
    mp.precision = strcmp(precision, "fast") ? NEEDLE_PRECISION_EXACT : NEEDLE_PRECISION_FAST;
    double *load = calloc((size_t)runs, sizeof(double)), *pre = calloc((size_t)runs, sizeof(double)),
           *dec = calloc((size_t)runs, sizeof(double));
    if (!load || !pre || !dec) {
        fprintf(stderr, "needle-bench: out of memory\n");
        return 1;
    }
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
    if (chat) {
        const int rc = bench_chat(model, (int)runs, json);
        needle_model_free(model);
        free(load), free(pre), free(dec);
        return rc ? rc : flushed_stdout();
    }
    needle_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    needle_model_get_info(model, &info);
    const int shrunk = !sized && (uint64_t)prompt_n + (uint64_t)decode_n > info.max_seq_len &&
                       info.max_seq_len > (uint64_t)decode_n;
    if (shrunk) prompt_n = (long)info.max_seq_len - decode_n;  /* e.g. the demo model's 512 positions */
    if ((uint64_t)prompt_n + (uint64_t)decode_n > info.max_seq_len) {
        fprintf(stderr, "needle-bench: %ld + %ld tokens exceed max_seq_len %u (defaults 512 + 128: lower --prompt-tokens "
                        "or --decode-tokens)\n", prompt_n, decode_n, info.max_seq_len);
        return 2;
    }
    uint32_t *prompt = malloc(sizeof(uint32_t) * (size_t)prompt_n);
    float *logits = malloc(sizeof(float) * info.out_vocab * (size_t)sequences);  /* out_vocab per state */
    prompt[0] = info.bos_id;
    for (long i = 1; i < prompt_n; ++i)  /* fixed pseudo-random ids, skipping 0..13 (specials) */
        prompt[i] = 14 + (uint32_t)((i * 2654435761u) % (info.vocab_size > 14 ? info.vocab_size - 14 : 1));
    needle_batch *batch = NULL;
    if (chunk > 0) {
        needle_status st = needle_batch_create(model, (uint32_t)chunk, &batch);
        if (st != NEEDLE_OK) return die("batch", st);
    }
    needle_batch *many = batch; /* scratch of needle_decode_many */
    if (sequences > 1 && chunk < sequences) {
        needle_status st = needle_batch_create(model, (uint32_t)sequences, &many);
        if (st != NEEDLE_OK) return die("batch of --sequences", st);
    }
    needle_state **ss = calloc((size_t)sequences, sizeof *ss);
    float **outs = calloc((size_t)sequences, sizeof *outs);
    uint32_t *toks = calloc((size_t)sequences, sizeof *toks);
    for (long q = 0; q < sequences; ++q) outs[q] = logits + (size_t)q * info.out_vocab;
    long long state_bytes = 0;
    for (long r = 0; r < runs; ++r) {
        needle_state_params sp;
        sp.struct_size = sizeof sp;
        needle_state_params_init(&sp);
        sp.kv_type = strcmp(kv, "int8") ? NEEDLE_KV_F32 : NEEDLE_KV_INT8;
        sp.max_tokens = (uint32_t)(max_tokens >= 0 ? max_tokens : prompt_n + decode_n);
        sp.probe_heads = strcmp(probe_heads, "off") ? 1 : 0;
        needle_status st = NEEDLE_OK;
        for (long q = 0; q < sequences; ++q) {
            const long long rss0 = resident_bytes();
            st = needle_state_create_ex(model, &sp, &ss[q]);
            if (st != NEEDLE_OK) return die("state", st);
            if (r == 0 && q == 0) state_bytes = resident_bytes() - rss0;  /* written at creation */
            const double t0 = now_ms();
            st = needle_state_prefill(ss[q], batch, prompt, (size_t)prompt_n, outs[q], info.out_vocab);
            if (q == 0) pre[r] = now_ms() - t0;
            if (st != NEEDLE_OK) return die("prefill", st);
        }
        const double t0 = now_ms();
        for (long i = 0; i < decode_n; ++i) {
            if (sequences == 1) {
                st = needle_state_decode(ss[0], argmax(logits, info.out_vocab), logits, info.out_vocab);
            } else {
                for (long q = 0; q < sequences; ++q) toks[q] = argmax(outs[q], info.out_vocab);
                st = needle_decode_many(ss, toks, (size_t)sequences, outs, info.out_vocab, many);
            }
            if (st != NEEDLE_OK) return die("decode", st);
        }
        dec[r] = now_ms() - t0;
        for (long q = 0; q < sequences; ++q) needle_state_free(ss[q]);
    }
    if (many != batch) needle_batch_free(many);
    free(ss), free(outs), free(toks);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double load_ms = median(load, (int)runs), prefill_ms = median(pre, (int)runs);
    const double decode_ms = median(dec, (int)runs);
    const double pre_tps = prompt_n / (prefill_ms / 1e3);
    const double dec_tps = decode_n ? (double)sequences * decode_n / (decode_ms / 1e3) : 0.0; /* aggregate */
    const long long rss = (long long)ru.ru_maxrss * 1024;
    if (json) {
        /* threads: what ran (needle_model_info.n_threads); isa_requested: NEEDLE_FORCE_ISA, refused
         * when it differs from isa; precision: needle_model_params.precision ("exact" or
         * "fast"); sequences: states decoded together (decode_tok_per_s is their sum) */
        printf("{\"isa\":\"%s\",\"precision\":\"%s\",\"sequences\":%ld,\"isa_requested\":\"%s\",\"threads\":%u,\"threads_requested\":%ld,\"chunk\":%ld,\"kv\":\"%s\",\"load_ms\":%.3f,\"prefill_tokens\":%ld,"
               "\"prefill_ms\":%.3f,\"prefill_tok_per_s\":%.1f,\"decode_tokens\":%ld,\"decode_ms\":%.3f,"
               "\"decode_tok_per_s\":%.1f,\"peak_rss_bytes\":%lld,\"state_bytes\":%lld,\"probe_heads\":%d}\n",
               needle_kernel_isa(), precision, sequences, needle_kernel_isa_requested(), info.n_threads, threads, chunk, kv, load_ms, prompt_n, prefill_ms, pre_tps, decode_n, decode_ms,
               dec_tps, rss, state_bytes, strcmp(probe_heads, "off") ? 1 : 0);
    } else {
        printf("model %s (isa %s, threads %u, chunk %ld, kv %s, runs %ld)\n", path, needle_kernel_isa(), info.n_threads,
               chunk, kv, runs);
        if (info.n_threads != (unsigned long)threads && threads != 0)
            printf("threads  %ld requested, clamped to the %u this machine runs\n", threads, info.n_threads);
        if (*needle_kernel_isa_requested() && strcmp(needle_kernel_isa_requested(), needle_kernel_isa()))
            printf("isa      NEEDLE_FORCE_ISA=%s refused (unknown or not run here)\n", needle_kernel_isa_requested());
        if (shrunk) printf("prompt   %ld tokens: 512 + 128 exceed this model's max_seq_len %u\n", prompt_n, info.max_seq_len);
        printf("precision %s\n", precision);
        if (!strcmp(probe_heads, "off")) printf("probe heads off (needle_state_params.probe_heads 0)\n");
        printf("load     %8.3f ms\n", load_ms);
        printf("prefill  %8.1f ms  %5ld tokens  %8.1f tok/s\n", prefill_ms, prompt_n, pre_tps);
        if (sequences > 1)
            printf("decode   %8.1f ms  %5ld tokens x %ld sequences  %8.1f tok/s aggregate\n", decode_ms, decode_n,
                   sequences, dec_tps);
        else
            printf("decode   %8.1f ms  %5ld tokens  %8.1f tok/s\n", decode_ms, decode_n, dec_tps);
        printf("peak RSS %8.1f MB\n", rss / 1048576.0);
        printf("state    %8.1f MB   (max_tokens %u, resident growth at creation)\n", state_bytes / 1048576.0,
               (unsigned)(max_tokens >= 0 ? max_tokens : prompt_n + decode_n));
    }
    needle_batch_free(batch);
    needle_model_free(model);
    free(prompt), free(logits), free(load), free(pre), free(dec);
    return flushed_stdout();
}
