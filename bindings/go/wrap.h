/* C side of the Go bindings: thin wrappers that call needle.h and, on failure, copy
 * needle_last_error() into a caller buffer inside the same cgo call (a goroutine may move to
 * another OS thread between two cgo calls, and the message is thread-local). */
#ifndef NEEDLE_GO_WRAP_H
#define NEEDLE_GO_WRAP_H

#include <stdint.h>
#include "needle.h"

needle_status ngo_check_abi(uint32_t expected, char *err, size_t cap);
needle_status ngo_model_load_file(const char *path, int32_t use_mmap, int32_t n_threads,
                                  uint32_t depth, needle_model **out, needle_model_info *info, char *err, size_t cap);
needle_status ngo_model_load_memory(const void *data, size_t size, int32_t n_threads,
                                    uint32_t depth, needle_model **out, needle_model_info *info, char *err, size_t cap);
/* the demo model compiled into libneedle (UNSUPPORTED in a build without it) */
needle_status ngo_model_load_builtin(int32_t n_threads, uint32_t depth, needle_model **out,
                                     needle_model_info *info, char *err, size_t cap);
needle_status ngo_state_create(needle_model *m, int32_t kv_window, int32_t kv_type, uint32_t max_tokens,
                               needle_state **out, char *err, size_t cap);
needle_status ngo_batch_create(needle_model *m, uint32_t capacity, needle_batch **out, char *err,
                               size_t cap);
needle_status ngo_decode(needle_state *s, uint32_t token, float *logits, size_t n, char *err,
                         size_t cap);
needle_status ngo_prefill(needle_state *s, needle_batch *b, const uint32_t *tokens, size_t n_tokens,
                          float *logits, size_t n, char *err, size_t cap);
/* needle_decode_many with the logits as one flat buffer of n rows of logits_len floats (Go may
 * not hand C an array of Go pointers); flat NULL skips the LM head. */
needle_status ngo_decode_many(needle_state **states, const uint32_t *tokens, size_t n, float *flat,
                              size_t logits_len, needle_batch *b, char *err, size_t cap);
needle_status ngo_tokenize(const needle_model *m, const char *text, size_t len, int add_bos,
                           uint32_t *tokens, size_t capacity, size_t *n_tokens, char *err, size_t cap);
needle_status ngo_detokenize(const needle_model *m, const uint32_t *tokens, size_t n_tokens,
                             char *text, size_t capacity, size_t *text_len, char *err, size_t cap);
/* probe heads and state persistence (issue 9) */
needle_status ngo_state_confidence(const needle_state *s, float *p, char *err, size_t cap);
needle_status ngo_state_embedding(const needle_state *s, float *out, size_t out_len, size_t *dim, char *err,
                                  size_t cap);
needle_status ngo_state_copy(needle_state *dst, const needle_state *src, char *err, size_t cap);
needle_status ngo_state_save(const needle_state *s, void *buf, size_t buf_cap, size_t *len, char *err,
                             size_t cap);
needle_status ngo_state_load(needle_state *s, const void *buf, size_t len, char *err, size_t cap);
/* tool-calling chat (issue 9) */
needle_status ngo_chat_create(needle_model *m, const char *system, const char *tools_json,
                              const needle_chat_params *p, needle_chat **out, char *err, size_t cap);
needle_status ngo_chat_render(needle_chat *c, const char *text, char *out, size_t out_cap, size_t *len,
                              char *err, size_t cap);
needle_status ngo_chat_complete(needle_chat *c, const char *text, uint32_t max_new_tokens, char *out,
                                size_t out_cap, size_t *len, char *err, size_t cap);
needle_status ngo_chat_tools_json(const needle_chat *c, char *out, size_t out_cap, size_t *len, char *err,
                                  size_t cap);
/* handle != 0 routes tokens to the Go callback registered under that handle. */
needle_status ngo_generate(needle_state *s, needle_batch *b, const char *prompt, size_t len,
                           const needle_generate_params *p, uintptr_t handle,
                           needle_generate_result *r, char *err, size_t cap);

#endif
