#include "wrap.h"

#include <stdio.h>
#include <stdlib.h>

#include "_cgo_export.h" /* needleGoToken */

static needle_status keep(needle_status st, char *err, size_t cap) {
    if (st != NEEDLE_OK && err && cap) snprintf(err, cap, "%s", needle_last_error());
    return st;
}

needle_status ngo_check_abi(uint32_t expected, char *err, size_t cap) {
    return keep(needle_check_abi(expected), err, cap);
}

static needle_status with_info(needle_status st, needle_model **out, needle_model_info *info,
                               char *err, size_t cap) {
    if (st == NEEDLE_OK) {
        info->struct_size = sizeof *info;
        st = needle_model_get_info(*out, info);
        if (st != NEEDLE_OK) {
            keep(st, err, cap);
            needle_model_free(*out);
            *out = NULL;
            return st;
        }
    }
    return keep(st, err, cap);
}

/* struct_size first in every params struct: needle_*_params_init writes only the caller's
 * struct_size bytes. */
needle_status ngo_model_load_file(const char *path, int32_t use_mmap, int32_t n_threads,
                                  uint32_t depth, needle_model **out, needle_model_info *info,
                                  char *err, size_t cap) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.use_mmap = use_mmap;
    p.n_threads = n_threads;
    p.depth = depth;
    return with_info(needle_model_load_file(path, &p, out), out, info, err, cap);
}

needle_status ngo_model_load_memory(const void *data, size_t size, int32_t n_threads,
                                    uint32_t depth, needle_model **out, needle_model_info *info,
                                    char *err, size_t cap) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    p.depth = depth;
    return with_info(needle_model_load_memory(data, size, &p, out), out, info, err, cap);
}

needle_status ngo_model_load_builtin(int32_t n_threads, uint32_t depth, needle_model **out,
                                     needle_model_info *info, char *err, size_t cap) {
    needle_model_params p;
    p.struct_size = sizeof p;
    needle_model_params_init(&p);
    p.n_threads = n_threads;
    p.depth = depth;
    return with_info(needle_model_load_builtin(&p, out), out, info, err, cap);
}

needle_status ngo_state_create(needle_model *m, int32_t kv_window, int32_t kv_type, uint32_t max_tokens,
                               needle_state **out, char *err, size_t cap) {
    needle_state_params p;
    p.struct_size = sizeof p;
    needle_state_params_init(&p);
    p.kv_window = kv_window;
    p.kv_type = kv_type;
    p.max_tokens = max_tokens;
    return keep(needle_state_create_ex(m, &p, out), err, cap);
}

needle_status ngo_batch_create(needle_model *m, uint32_t capacity, needle_batch **out, char *err,
                               size_t cap) {
    return keep(needle_batch_create(m, capacity, out), err, cap);
}

needle_status ngo_decode(needle_state *s, uint32_t token, float *logits, size_t n, char *err,
                         size_t cap) {
    return keep(needle_state_decode(s, token, logits, n), err, cap);
}

needle_status ngo_prefill(needle_state *s, needle_batch *b, const uint32_t *tokens, size_t n_tokens,
                          float *logits, size_t n, char *err, size_t cap) {
    return keep(needle_state_prefill(s, b, tokens, n_tokens, logits, n), err, cap);
}

needle_status ngo_decode_many(needle_state **states, const uint32_t *tokens, size_t n, float *flat,
                              size_t logits_len, needle_batch *b, char *err, size_t cap) {
    float **rows = NULL;
    if (flat && n) {
        /* n is the caller's slice length; needle_decode_many refuses more than the batch holds,
         * so check the product before allocating from it. */
        if (n > ((size_t)-1) / sizeof *rows) return keep(needle_decode_many(states, tokens, n, NULL, 0, b), err, cap);
        rows = (float **)malloc(n * sizeof *rows);
        if (!rows) {
            if (err && cap) snprintf(err, cap, "decode_many: no memory for %zu logits pointers", n);
            return NEEDLE_E_NO_MEMORY;
        }
        for (size_t i = 0; i < n; ++i) rows[i] = flat + i * logits_len;
    }
    needle_status st = needle_decode_many(states, tokens, n, rows, rows ? logits_len : 0, b);
    free(rows);
    return keep(st, err, cap);
}

needle_status ngo_state_confidence(const needle_state *s, float *p, char *err, size_t cap) {
    return keep(needle_state_confidence(s, p), err, cap);
}

needle_status ngo_state_embedding(const needle_state *s, float *out, size_t out_len, size_t *dim, char *err,
                                  size_t cap) {
    return keep(needle_state_embedding(s, out, out_len, dim), err, cap);
}

needle_status ngo_state_copy(needle_state *dst, const needle_state *src, char *err, size_t cap) {
    return keep(needle_state_copy(dst, src), err, cap);
}

needle_status ngo_state_save(const needle_state *s, void *buf, size_t buf_cap, size_t *len, char *err,
                             size_t cap) {
    return keep(needle_state_save(s, buf, buf_cap, len), err, cap);
}

needle_status ngo_state_load(needle_state *s, const void *buf, size_t len, char *err, size_t cap) {
    return keep(needle_state_load(s, buf, len), err, cap);
}

needle_status ngo_tokenize(const needle_model *m, const char *text, size_t len, int add_bos,
                           uint32_t *tokens, size_t capacity, size_t *n_tokens, char *err, size_t cap) {
    return keep(needle_model_tokenize(m, text, len, add_bos, tokens, capacity, n_tokens), err, cap);
}

needle_status ngo_detokenize(const needle_model *m, const uint32_t *tokens, size_t n_tokens,
                             char *text, size_t capacity, size_t *text_len, char *err, size_t cap) {
    return keep(needle_model_detokenize(m, tokens, n_tokens, text, capacity, text_len), err, cap);
}

static int trampoline(uint32_t token, const char *text, size_t len, void *user) {
    return needleGoToken(token, (char *)text, len, (uintptr_t)user);
}

needle_status ngo_generate(needle_state *s, needle_batch *b, const char *prompt, size_t len,
                           const needle_generate_params *p, uintptr_t handle,
                           needle_generate_result *r, char *err, size_t cap) {
    return keep(needle_generate(s, b, prompt, len, p, handle ? trampoline : NULL, (void *)handle, r),
                err, cap);
}

needle_status ngo_chat_create(needle_model *m, const char *system, const char *tools_json,
                              const needle_chat_params *p, needle_chat **out, char *err, size_t cap) {
    return keep(needle_chat_create(m, system, tools_json, p, out), err, cap);
}

needle_status ngo_chat_render(needle_chat *c, const char *text, char *out, size_t out_cap, size_t *len,
                              char *err, size_t cap) {
    return keep(needle_chat_render(c, text, out, out_cap, len), err, cap);
}

needle_status ngo_chat_complete(needle_chat *c, const char *text, uint32_t max_new_tokens, char *out,
                                size_t out_cap, size_t *len, char *err, size_t cap) {
    return keep(needle_chat_complete(c, text, max_new_tokens, out, out_cap, len), err, cap);
}

needle_status ngo_chat_tools_json(const needle_chat *c, char *out, size_t out_cap, size_t *len, char *err,
                                  size_t cap) {
    return keep(needle_chat_tools_json(c, out, out_cap, len), err, cap);
}
