/* needle-consumer: the smallest program built against an installed libneedle.
 * Prints the library version and ABI; with a model path, loads it and prints its geometry.
 *
 *   needle-consumer [MODEL.cact]                                                            */
#include <stdio.h>

#include <needle.h>

int main(int argc, char **argv) {
    printf("needle %s, ABI %u (header ABI %d)\n", needle_version_string(),
           (unsigned)needle_abi_version(), NEEDLE_ABI_VERSION);
    if (needle_check_abi(NEEDLE_ABI_VERSION) != NEEDLE_OK) {
        fprintf(stderr, "needle-consumer: %s\n", needle_last_error());
        return 1;
    }
    if (argc > 1) {
        needle_model *model = NULL;
        needle_status st = needle_model_load_file(argv[1], NULL, &model);
        if (st != NEEDLE_OK) {
            fprintf(stderr, "needle-consumer: %s: %s (%s)\n", argv[1], needle_last_error(),
                    needle_status_string(st));
            return 1;
        }
        needle_model_info info = {.struct_size = sizeof info};
        needle_model_get_info(model, &info);
        printf("model %s: vocab %u, d_model %u, %u layers\n", argv[1], (unsigned)info.vocab_size,
               (unsigned)info.d_model, (unsigned)info.num_layers);
        needle_model_free(model);
    }
    return 0;
}
