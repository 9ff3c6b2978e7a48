/* Regression probe: load libneedle with dlopen, run a batched prefill on 2 threads (so oneTBB
 * starts worker threads), free everything, dlclose the library, and keep running. A host that
 * unloads a library (mono does at exit; Rust libloading on drop) must not be left with worker
 * threads executing unmapped code. Usage: dlclose_probe LIBNEEDLE MODEL. Exits 0 on success. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include "needle.h"

#define SYM(name) name##_fn name##_p = (name##_fn)dlsym(lib, #name)
typedef void (*needle_model_params_init_fn)(needle_model_params *);
typedef needle_status (*needle_model_load_file_fn)(const char *, const needle_model_params *, needle_model **);
typedef needle_status (*needle_state_create_fn)(needle_model *, needle_state **);
typedef needle_status (*needle_batch_create_fn)(needle_model *, uint32_t, needle_batch **);
typedef needle_status (*needle_state_prefill_fn)(needle_state *, needle_batch *, const uint32_t *, size_t, float *, size_t);
typedef void (*needle_state_free_fn)(needle_state *);
typedef void (*needle_batch_free_fn)(needle_batch *);
typedef void (*needle_model_free_fn)(needle_model *);

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: dlclose_probe LIBNEEDLE MODEL\n"); return 2; }
    for (int round = 0; round < 3; ++round) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
        SYM(needle_model_params_init); SYM(needle_model_load_file); SYM(needle_state_create);
        SYM(needle_batch_create); SYM(needle_state_prefill); SYM(needle_state_free);
        SYM(needle_batch_free); SYM(needle_model_free);
        needle_model_params p;
        p.struct_size = sizeof p; /* init writes only struct_size bytes */
        needle_model_params_init_p(&p);
        p.n_threads = 2;
        needle_model *m = NULL; needle_state *s = NULL; needle_batch *b = NULL;
        if (needle_model_load_file_p(argv[2], &p, &m) != 0 || needle_state_create_p(m, &s) != 0 ||
            needle_batch_create_p(m, 64, &b) != 0) { fprintf(stderr, "load/create failed\n"); return 1; }
        uint32_t tokens[64];
        for (int i = 0; i < 64; ++i) tokens[i] = 3 + (uint32_t)i;
        static float logits[1 << 20];
        if (needle_state_prefill_p(s, b, tokens, 64, logits, sizeof logits / sizeof logits[0]) != 0) {
            fprintf(stderr, "prefill failed\n"); return 1;
        }
        needle_batch_free_p(b); needle_state_free_p(s); needle_model_free_p(m);
        dlclose(lib);
        /* Give any surviving worker thread time to wake up in unmapped code. */
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    puts("dlclose probe: ok");
    return 0;
}
