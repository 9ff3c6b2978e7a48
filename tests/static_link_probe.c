/* Links against libneedle.a with the C compiler and only the C++ runtime (-lstdc++ -lm) and, if
 * the library was built with oneTBB, TBB and pthreads (tests/CMakeLists.txt): the link itself is
 * the first check. Then a real run: a 40-token batched prefill of the model equals 40 decode
 * steps bit for bit. Usage: static_link_probe MODEL. Exits 0 on success. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"

#define N 40

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: static_link_probe MODEL\n"); return 2; }
    if (needle_check_abi(NEEDLE_ABI_VERSION) != NEEDLE_OK) { fprintf(stderr, "ABI mismatch\n"); return 1; }
    needle_model *m = NULL;
    needle_state *a = NULL, *b = NULL;
    needle_batch *batch = NULL;
    if (needle_model_load_file(argv[1], NULL, &m) != NEEDLE_OK || needle_state_create(m, &a) != NEEDLE_OK ||
        needle_state_create(m, &b) != NEEDLE_OK || needle_batch_create(m, N, &batch) != NEEDLE_OK) {
        fprintf(stderr, "load/create failed: %s\n", needle_last_error());
        return 1;
    }
    needle_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (needle_model_get_info(m, &info) != NEEDLE_OK) return 1;
    const size_t V = info.vocab_size;
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    uint32_t tokens[N];
    for (int i = 0; i < N; ++i) tokens[i] = 4 + (uint32_t)(i * 37) % (info.vocab_size - 4);
    if (!la || !lb || needle_state_prefill(a, batch, tokens, N, la, V) != NEEDLE_OK) return 1;
    for (int i = 0; i < N; ++i)
        if (needle_state_decode(b, tokens[i], lb, V) != NEEDLE_OK) return 1;
    const int same = memcmp(la, lb, V * sizeof *la) == 0;
    printf("static link probe: kernels %s, batched %s sequential\n", needle_kernel_isa(), same ? "==" : "!=");
    free(la); free(lb);
    needle_batch_free(batch); needle_state_free(a); needle_state_free(b); needle_model_free(m);
    return same ? 0 : 1;
}
