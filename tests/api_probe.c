/* Child process of test_hardening.cpp: runs one scenario against libneedle in a fresh process, so
 * that a crash fails one test instead of the suite and oneTBB starts from its initial state.
 * Writes nothing except what a mode is asked to report; the test captures fd 1 and 2.
 *
 *   api_probe run MODEL N_THREADS EXPECT  load with n_threads N_THREADS (any int32), check that
 *                                         needle_model_info.n_threads is EXPECT (exit 12 after the
 *                                         run), state, batch, prefill, decode, generate, free.
 *   api_probe isa                         prints "needle_kernel_isa() needle_kernel_isa_requested()"
 *   api_probe threads MODEL N_THREADS     prints the process's thread count (/proc/self/task) before
 *                                         the load, after it, and after a state ran a prefill and
 *                                         a decode step: "before load run".
 *
 * Exit status: 0 success; 2 usage; 10 + step for the step that failed (see `step` below). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "needle.h"

static int count_tokens(uint32_t token, const char *text, size_t len, void *user) {
    (void)text, (void)len;
    if (token != NEEDLE_NO_TOKEN) ++*(int *)user;
    return 0;
}

/* The model at path loaded with n_threads, or NULL. */
static needle_model *load(const char *path, int32_t n_threads) {
    needle_model_params mp;
    mp.struct_size = sizeof mp;
    needle_model_params_init(&mp);
    mp.n_threads = n_threads;
    needle_model *m = NULL;
    return needle_model_load_file(path, &mp, &m) == NEEDLE_OK ? m : NULL;
}

static int run(const char *path, int32_t n_threads, uint32_t expect) {
    needle_model *m = load(path, n_threads);
    if (!m) return 10;
    needle_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (needle_model_get_info(m, &info) != NEEDLE_OK) return 11;
    const int wrong_info = info.n_threads != expect;  /* reported last: the run goes on */
    needle_state *s = NULL;
    needle_batch *b = NULL;
    if (needle_state_create(m, &s) != NEEDLE_OK) return 13;
    if (needle_batch_create(m, 8, &b) != NEEDLE_OK) return 14;
    float *logits = malloc(sizeof(float) * info.vocab_size);
    if (!logits) return 15;
    uint32_t prompt[20];
    for (int i = 0; i < 20; ++i) prompt[i] = (uint32_t)(5 + 7 * i) % info.vocab_size;
    if (needle_state_prefill(s, b, prompt, 20, logits, info.vocab_size) != NEEDLE_OK) return 16;
    if (needle_state_decode(s, prompt[3], logits, info.vocab_size) != NEEDLE_OK) return 17;
    if (needle_state_pos(s) != 21) return 18;
    needle_generate_params gp;
    gp.struct_size = sizeof gp;
    needle_generate_params_init(&gp);
    gp.max_tokens = 4;
    int streamed = 0;
    needle_state_reset(s);
    const needle_status st = needle_generate(s, b, "Hello", 5, &gp, count_tokens, &streamed, NULL);
    if (st != NEEDLE_OK || streamed < 1) return 19;
    free(logits);
    needle_batch_free(b);
    needle_state_free(s);
    needle_model_free(m);
    return wrong_info ? 12 : 0;
}

/* Threads of this process: the entries of /proc/self/task (-1 if it cannot be read). */
static int thread_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n;
}

static int threads(const char *path, int32_t n_threads) {
    const int before = thread_count();
    needle_model *m = load(path, n_threads);
    if (!m) return 10;
    const int loaded = thread_count();
    needle_state *s = NULL;
    needle_batch *b = NULL;
    if (needle_state_create(m, &s) != NEEDLE_OK) return 13;
    if (needle_batch_create(m, 32, &b) != NEEDLE_OK) return 14;
    uint32_t prompt[32];
    for (int i = 0; i < 32; ++i) prompt[i] = (uint32_t)(5 + 7 * i);
    if (needle_state_prefill(s, b, prompt, 32, NULL, 0) != NEEDLE_OK) return 16;
    if (needle_state_decode(s, prompt[3], NULL, 0) != NEEDLE_OK) return 17;
    printf("%d %d %d\n", before, loaded, thread_count());
    needle_batch_free(b);
    needle_state_free(s);
    needle_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "run"))
        return run(argv[2], (int32_t)strtol(argv[3], NULL, 10), (uint32_t)strtoul(argv[4], NULL, 10));
    if (argc == 4 && !strcmp(argv[1], "threads")) return threads(argv[2], (int32_t)strtol(argv[3], NULL, 10));
    if (argc == 2 && !strcmp(argv[1], "isa")) {
        printf("%s %s\n", needle_kernel_isa(), needle_kernel_isa_requested());
        return 0;
    }
    return 2;
}
