/*
 * needle.h — the C ABI of the needle inference engine for Cactus Compute's Needle models.
 *
 * This header is the only public surface of libneedle. It is C99 and C++ compatible.
 *
 * Objects
 *   needle_model  weights, geometry and tokenizer of one loaded .cact container. Immutable after
 *                 load: any number of threads may use one model at once.
 *   needle_state  one sequence: position, token history, KV ring, Engram value ring and the
 *                 scratch of a single decode step. Use from one thread at a time (it may move
 *                 between threads).
 *   needle_batch  scratch for batched (chunked) prefill of up to `capacity` positions. Use from one
 *                 thread at a time; may serve any state of the same model.
 *
 * Handles may be freed in any order: a state or batch keeps its model alive.
 *
 * Errors
 *   Every fallible call returns a needle_status. On failure, needle_last_error() gives a specific
 *   message for the calling thread (like errno, successful calls leave it unchanged). No call
 *   aborts, asserts or lets a C++ exception escape. Failing calls leave their state unchanged:
 *   arguments are checked first (NEEDLE_E_INVALID_ARGUMENT), then buffer sizes
 *   (NEEDLE_E_BUFFER_TOO_SMALL), then room in the sequence (NEEDLE_E_CONTEXT_FULL). Prefill
 *   reads the token ids only when all of them fit in the state's room (or there is one), so a
 *   wrong n_tokens (SIZE_MAX) is CONTEXT_FULL, never a read past the caller's array (a bad id
 *   in a call that does not fit is not reported as such).
 *
 * Output: the library writes nothing to stdout or stderr, oneTBB included (thread counts are
 *   clamped before oneTBB sees them; only a host that sets TBB_VERSION=1 gets oneTBB's banner).
 *
 * Buffers are always owned by the caller; lengths are in elements unless stated (bytes for text).
 * Text is UTF-8.
 *
 * Formulas and formats: shared/spec/container-v2.md (loader), model-v2.md (forward pass),
 * tokenizer-and-prompt.md (tokenizer, generation).
 */
#ifndef NEEDLE_H
#define NEEDLE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(NEEDLE_BUILDING_LIBRARY)
#define NEEDLE_API __declspec(dllexport)
#else
#define NEEDLE_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define NEEDLE_API __attribute__((visibility("default")))
#else
#define NEEDLE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

/** ABI version of this header. Bumped on any incompatible change of a declaration below. */
#define NEEDLE_ABI_VERSION 1

/** ABI version the loaded library implements. Any thread. */
NEEDLE_API uint32_t needle_abi_version(void);

/** Library version, e.g. "0.1.0". Static text. Any thread. */
NEEDLE_API const char *needle_version_string(void);

/** Refuses a library built for another ABI: bindings call it once, right after loading the
 *  library, with the NEEDLE_ABI_VERSION they were written against.
 *  Returns NEEDLE_OK when `expected_abi` equals needle_abi_version(), else NEEDLE_E_UNSUPPORTED
 *  (message names both versions). Any thread. */
NEEDLE_API int32_t needle_check_abi(uint32_t expected_abi);

/** Instruction set of the kernels in use: "avx512", "avx2", "sse4_2", "neon" or "scalar".
 *  Chosen once per process: the best the CPU runs, or the one named by the environment variable
 *  NEEDLE_FORCE_ISA (e.g. NEEDLE_FORCE_ISA=sse4_2) when this build has it and the CPU runs it.
 *  An unknown or unavailable name is refused without a message: the best ISA runs and this
 *  function reports it (needle_kernel_isa_requested() shows the refused request). Static text.
 *  Any thread. */
NEEDLE_API const char *needle_kernel_isa(void);

/* ---------------------------------------------------------------- hardening (issue 13) */

/** NEEDLE_FORCE_ISA as read when the kernels were chosen: "" when unset or empty, else its value
 *  (at most 31 bytes). It differs from needle_kernel_isa() exactly when the request was refused
 *  (unknown name, ISA not built, or not run by this CPU). Static text. Any thread. */
NEEDLE_API const char *needle_kernel_isa_requested(void);

/* ---------------------------------------------------------------- status */

/** Status of a fallible call. Codes are never renumbered. */
typedef int32_t needle_status;

#define NEEDLE_OK 0
#define NEEDLE_E_INVALID_ARGUMENT 1  /* NULL handle/pointer, token >= vocab_size, bad parameter */
#define NEEDLE_E_IO 2                /* file could not be opened, read or mapped */
#define NEEDLE_E_FORMAT 3            /* not a .cact container, or a damaged one */
#define NEEDLE_E_UNSUPPORTED 4       /* a known format or feature this build cannot run */
#define NEEDLE_E_NO_MEMORY 5         /* a genuine allocation failure */
#define NEEDLE_E_CONTEXT_FULL 6      /* the tokens would pass the model's max_seq_len */
#define NEEDLE_E_BUFFER_TOO_SMALL 7  /* caller buffer too small; the needed size is reported */
#define NEEDLE_E_CANCELLED 8         /* a callback asked to stop; the state stays valid */
#define NEEDLE_E_INTERNAL 9          /* a bug in needle; please report the message */

/** Short static description of a status code ("unknown status" for codes not listed above).
 *  Any thread. */
NEEDLE_API const char *needle_status_string(needle_status s);

/** Message of the most recent failed call on this thread, e.g.
 *  "tensor 17 (layer01.k_proj): nbytes 4096, expected 4352"; "" if none failed yet.
 *  The pointer stays valid until the next failing call on this thread. */
NEEDLE_API const char *needle_last_error(void);

/* ---------------------------------------------------------------- handles */

typedef struct needle_model needle_model;
typedef struct needle_state needle_state;
typedef struct needle_batch needle_batch;

/* ---------------------------------------------------------------- model */

/* Params structs (needle_model_params, needle_state_params, needle_generate_params,
 * needle_chat_params) grow only at the end. The caller sets `struct_size = sizeof` FIRST, then
 * calls needle_*_params_init, which fills the defaults of the fields lying wholly within
 * struct_size and writes nothing past it (nor struct_size itself): a program built against an
 * older, shorter struct never has a newer library write beyond it. A struct_size below the
 * struct's first layout is ignored by init (nothing written) and refused with
 * NEEDLE_E_INVALID_ARGUMENT by the call taking the struct, which reads fields up to struct_size
 * (later ones keep their defaults). */

/** Numerics of a model's CQ matmuls (needle_model_params.precision). */
typedef enum needle_precision {
    NEEDLE_PRECISION_EXACT = 0, /* f32 activations: the reference numerics (cq-kernels.md) */
    NEEDLE_PRECISION_FAST = 1   /* int8 activations per CQ group times int8 codebook levels,
                                   integer dot products (VNNI / vpmaddubsw / NEON). Not bit-faithful:
                                   logits differ from EXACT by a few 1e-2 (README, "Fast numerics") */
} needle_precision;

/** Load options. Set struct_size, then needle_model_params_init(), then change fields. */
typedef struct needle_model_params {
    uint32_t struct_size; /* set by the caller to sizeof(needle_model_params) before init; the
                             first layout ended after n_threads (12 bytes) */
    int32_t use_mmap;     /* 1 (default): map the file read-only; 0: read it into memory */
    int32_t n_threads;    /* worker threads for this model's kernels; 0 (default) = all cores.
                             Above the cores this process may use (CPU affinity), or above a
                             host's tbb::global_control::max_allowed_parallelism, it is clamped
                             to that: needle_model_info.n_threads reports the count used.
                             A library built with -DNEEDLE_WITH_TBB=OFF runs every state on its
                             caller's thread: any n_threads >= 0 is accepted and ignored. */
    uint32_t depth;       /* Needle 3 depth-ladder rung (model-v3.md §5): 0 (default) = all layers,
                             2..num_layers = that many layers; anything else INVALID_ARGUMENT.
                             Needle 2 accepts only 0. Added after the first layout: a struct_size
                             that ends before it means 0 */
    int32_t precision;    /* needle_precision; default NEEDLE_PRECISION_EXACT, anything else
                             INVALID_ARGUMENT. Added after depth: a struct_size that ends before
                             it means EXACT */
} needle_model_params;

/** Fills `p` with defaults (use_mmap 1, n_threads 0, depth 0, precision EXACT), only the fields within the
 *  caller's p->struct_size (set it first); struct_size < 12 or NULL is ignored. Any thread. */
NEEDLE_API void needle_model_params_init(needle_model_params *p);

/** Loads a .cact container from a file and validates all of it: Needle 2 (tag 0x05E12A83,
 *  container-v2.md §12) or Needle 3 (tag 0x05E12A84, container-v3.md §5).
 *  `p` may be NULL (defaults). On success writes a new model to *out; on failure writes NULL.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL path/out, bad params); IO (cannot open/read/map);
 *  FORMAT (not a container, or damaged: the message names the field and values);
 *  UNSUPPORTED (a known tag this build cannot run: the old geometry-less 0x05E12A82);
 *  INVALID_ARGUMENT also for a depth the model has no rung for; NO_MEMORY.
 *  Loads typically take a few milliseconds. */
NEEDLE_API needle_status needle_model_load_file(const char *path, const needle_model_params *p,
                                                needle_model **out);

/** As needle_model_load_file, from `size` bytes at `data`, which are copied: the caller may free
 *  `data` as soon as the call returns. `use_mmap` is ignored. */
NEEDLE_API needle_status needle_model_load_memory(const void *data, size_t size,
                                                  const needle_model_params *p,
                                                  needle_model **out);

/** Loads the demo model compiled into this library (models/needle-demo.cact: a small Needle 2
 *  trained to call the tools of needle_builtin_tools_json(); CMake option NEEDLE_BUILTIN_MODEL,
 *  on by default; models/README.md is its model card), as needle_model_load_memory would.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL out, bad params); UNSUPPORTED (this build has no
 *  built-in model); NO_MEMORY. *out is NULL on failure. */
NEEDLE_API needle_status needle_model_load_builtin(const needle_model_params *p, needle_model **out);

/** The tools JSON array the built-in model was trained for (models/needle-demo.tools.json, for
 *  needle_chat_create), or NULL when this build has no built-in model. Static text. Any thread. */
NEEDLE_API const char *needle_builtin_tools_json(void);

/** Releases the caller's reference. States and batches made from the model keep it alive until
 *  they are freed too. NULL is ignored. */
NEEDLE_API void needle_model_free(needle_model *model);

/** Geometry and ids of a loaded model. The caller sets `struct_size` to sizeof(needle_model_info)
 *  (older, shorter versions of this struct are accepted; fields past struct_size are not written). */
typedef struct needle_model_info {
    uint32_t struct_size;
    uint32_t format_version;   /* container format: 2 for Needle 2 (.cact tag 0x05E12A83), 3 for
                                  Needle 3 (0x05E12A84) */
    uint32_t vocab_size;       /* V: token ids below it are accepted as input */
    uint32_t d_model;          /* D */
    uint32_t num_layers;       /* L */
    uint32_t num_heads;        /* H: query heads */
    uint32_t num_kv_heads;     /* K: key/value heads (GQA groups) */
    uint32_t head_dim;         /* query/key head width (qk_head_dim) */
    uint32_t v_head_dim;       /* value head width (equals head_dim in Needle 2) */
    uint32_t max_seq_len;      /* positions a state can hold (tokens) */
    uint32_t kv_window;        /* effective attention window in tokens; 0 = full causal
                                  (Needle 3: sliding_window of its local layers) */
    uint32_t mhc_lanes;        /* residual lanes n */
    uint32_t num_engram_sites; /* S */
    uint32_t bos_id, eos_id, pad_id, unk_id; /* from the tokenizer blob */
    uint32_t has_tokenizer;    /* 1 if the container carries a tokenizer */
    uint64_t weight_bytes;     /* bytes of tensor payload (all records but the tokenizer) */
    uint64_t file_bytes;       /* size of the container */
    /* ---- added by issue 8 (Needle 3); older struct_size values end before these */
    uint32_t out_vocab;        /* logits rows: every logits buffer holds this many floats
                                  (Needle 2: vocab_size; Needle 3: ids >= out_vocab are input-only) */
    uint64_t global_layer_mask; /* bit l set: layer l (as run, after the depth ladder) attends
                                   globally; Needle 2: 0 */
    uint32_t qkv_conv_taps;    /* taps of the causal Q/K/V conv (Needle 3), 0 = none */
    uint32_t has_confidence_head;  /* 1 if needle_state_confidence is supported */
    uint32_t has_contrastive_head; /* 1 if the container has an embedding (contrastive) head */
    uint32_t n_threads;        /* worker threads the model's states run with: params.n_threads,
                                  0 and counts above the machine's concurrency clamped (issue 13) */
} needle_model_info;

/** Writes the model's info. Returns NEEDLE_OK, or INVALID_ARGUMENT (NULL arguments or a
 *  struct_size smaller than the first version of the struct). Any thread. */
NEEDLE_API needle_status needle_model_get_info(const needle_model *model, needle_model_info *info);

/* ---------------------------------------------------------------- state and batch */

/** Creates an empty sequence (position 0) with the model's attention window. Memory: the KV ring
 *  (num_layers * 2 * num_kv_heads * ring * head_dim floats, ring = kv_window or max_seq_len)
 *  plus one position of scratch and a logits buffer, all allocated here, none later.
 *  Returns NEEDLE_OK, INVALID_ARGUMENT, NO_MEMORY. */
NEEDLE_API needle_status needle_state_create(needle_model *model, needle_state **out);

/** Element type of a state's KV cache (needle_state_params.kv_type). */
typedef enum needle_kv_type {
    NEEDLE_KV_F32 = 0,  /* float32: the reference numerics (model-v2.md §4.4) */
    NEEDLE_KV_INT8 = 1  /* int8 + one float32 scale per position and KV head: 3.8x less KV
                           memory at head_dim 64 (needle2: 3.7 MB instead of 14.2 MB at window
                           256); logits are no longer bit-faithful (README, "int8 KV cache":
                           measured error) */
} needle_kv_type;

/** Options of needle_state_create_ex. Set struct_size, then needle_state_params_init(). */
typedef struct needle_state_params {
    uint32_t struct_size; /* sizeof(needle_state_params), set by the caller before init; the first
                             layout ended after kv_window (8 bytes) */
    int32_t kv_window; /* -1 (default): the model's window; 0: full causal attention over the
                          whole sequence (ring of max_seq_len positions, as upstream's reference
                          runs with window 0; a Needle 3 model refuses 0 with
                          NEEDLE_E_INVALID_ARGUMENT: its local layers need a window, use -1);
                          > 0: this window in tokens */
    int32_t kv_type;   /* needle_kv_type; default NEEDLE_KV_F32. Added after the first layout:
                          a struct_size that ends before it means NEEDLE_KV_F32 */
    uint32_t max_tokens; /* positions the state can hold: 0 (default) = max_seq_len; else the KV
                            memory is sized for min(ring, max_tokens) positions per layer at
                            creation and never grows; feeding past it is CONTEXT_FULL with the
                            state unchanged. Added after kv_type (shorter struct_size: 0) */
    int32_t probe_heads; /* 1 (default): pool the probe heads while positions are fed, so that
                            needle_state_confidence and needle_state_embedding can answer; 0: skip
                            that pooling (per position and layer, on the calling thread): decode
                            and prefill are faster (needle2, 2 threads: ~0.9x the time, README
                            "Speed") and the state is ~1.3 MB smaller, the logits are the same bits,
                            and those two calls return NEEDLE_E_UNSUPPORTED. No effect on a model
                            without probe heads. Anything else INVALID_ARGUMENT. Added after
                            max_tokens (shorter struct_size: 1) */
} needle_state_params;

/** Fills `p` with defaults (kv_window -1, kv_type NEEDLE_KV_F32, max_tokens 0, probe_heads 1),
 *  only the fields within the caller's p->struct_size (set it first); struct_size < 8 or NULL is
 *  ignored. */
NEEDLE_API void needle_state_params_init(needle_state_params *p);

/** needle_state_create with options (`p` NULL = defaults). */
NEEDLE_API needle_status needle_state_create_ex(needle_model *model, const needle_state_params *p,
                                                needle_state **out);

/** Frees a state. NULL is ignored. Called from the token callback of a needle_generate running
 *  on this state, the state is freed when that needle_generate returns. */
NEEDLE_API void needle_state_free(needle_state *state);

/** Rewinds the sequence to position 0 (history cleared). NULL is ignored, and so is a call from
 *  the token callback of a needle_generate running on this state (see needle_generate). */
NEEDLE_API void needle_state_reset(needle_state *state);

/** Tokens fed so far (the next position). 0 for NULL. */
NEEDLE_API uint32_t needle_state_pos(const needle_state *state);

/** Creates prefill scratch for chunks of up to `capacity` positions (about 70 KB per position at
 *  Needle 2 geometry). 32 is the recommended capacity: the matmul kernels decode a weight block
 *  once per pass of up to 12 positions (AVX-512; 4 on AVX2) and keep it in cache across a chunk's
 *  passes, so larger chunks only cost memory (128 takes 6.7 MB more than 32). Returns NEEDLE_OK; INVALID_ARGUMENT (NULL, capacity 0 or above
 *  max_seq_len); NO_MEMORY. */
NEEDLE_API needle_status needle_batch_create(needle_model *model, uint32_t capacity,
                                             needle_batch **out);

/** Frees a batch. NULL is ignored. */
NEEDLE_API void needle_batch_free(needle_batch *batch);

/* ---------------------------------------------------------------- forward */

/** Feeds one token at the state's position and advances it by one.
 *  logits: NULL with logits_len 0 skips the LM head; otherwise receives vocab_size floats
 *  (the next-token logits: out_vocab floats, needle_model_info). Allocates nothing.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL state, token >= vocab_size, NULL logits with
 *  logits_len > 0); BUFFER_TOO_SMALL (logits_len < out_vocab); CONTEXT_FULL (position is
 *  max_seq_len or the state's max_tokens). On failure the state is unchanged. */
NEEDLE_API needle_status needle_state_decode(needle_state *state, uint32_t token, float *logits,
                                             size_t logits_len);

/** Feeds `n_tokens` tokens. `batch` NULL feeds them one position at a time; otherwise in chunks
 *  of the batch's capacity (same resulting state and logits either way). logits NULL (len 0)
 *  skips the LM head, otherwise receives the LAST position's vocab_size logits.
 *  Prefill of 0 tokens without logits is a no-op.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL state, NULL tokens with n_tokens > 0, a token
 *  >= vocab_size, a batch of another model, n_tokens 0 with a logits buffer); BUFFER_TOO_SMALL;
 *  CONTEXT_FULL (pos + n_tokens > max_seq_len or max_tokens). On failure the state is unchanged. */
NEEDLE_API needle_status needle_state_prefill(needle_state *state, needle_batch *batch,
                                              const uint32_t *tokens, size_t n_tokens,
                                              float *logits, size_t logits_len);

/** One decode step of `n` sequences at once: tokens[i] is fed to states[i] at its own position
 *  and states[i] advances by one. The states must be of one model (Needle 2 or 3, any positions,
 *  any options); each weight group is decoded once for all of them, attention stays per state.
 *  Each state ends with the same bits and logits as needle_state_decode(states[i], tokens[i])
 *  would give it. states[n], tokens[n]: caller's arrays (read only). logits: NULL with
 *  logits_len 0 skips the LM head; otherwise n caller buffers of logits_len >= out_vocab floats
 *  each, logits[i] receiving the next-token logits of states[i]. `scratch` is a needle_batch of
 *  the same model with capacity >= n (it holds the step's rows; row i is states[i]). The call
 *  allocates nothing. Thread-safety: the states and the batch must not be in use by another call
 *  meanwhile (other states and batches of the model may run concurrently); it runs on the
 *  first state's threads.
 *  Everything is checked before any state changes; on failure no state changes.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL states/tokens/scratch, n 0 or above the batch's
 *  capacity, a NULL or busy state, a state of another model than the batch's, a state listed
 *  twice, a token >= vocab_size, NULL logits with logits_len > 0, a NULL logits[i]);
 *  BUFFER_TOO_SMALL (logits_len < out_vocab); CONTEXT_FULL (a state at max_seq_len or its
 *  max_tokens). */
NEEDLE_API needle_status needle_decode_many(needle_state *const *states, const uint32_t *tokens, size_t n,
                                            float *const *logits, size_t logits_len, needle_batch *scratch);

/* ---------------------------------------------------------------- tokenizer */

/** Encodes UTF-8 text with the model's own tokenizer (SentencePiece BPE with byte fallback and
 *  the chat markers, tokenizer-and-prompt.md §2). add_bos != 0 prepends the BOS id.
 *  Writes up to `capacity` ids to `tokens` and the count to *n_tokens. If `capacity` is too small
 *  nothing is written to `tokens`, *n_tokens receives the needed count and the call returns
 *  BUFFER_TOO_SMALL (tokens may be NULL with capacity 0 to ask for the size).
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL model/n_tokens, NULL text with text_len > 0,
 *  invalid UTF-8); UNSUPPORTED (the container has no tokenizer); BUFFER_TOO_SMALL. Any thread. */
NEEDLE_API needle_status needle_model_tokenize(const needle_model *model, const char *text,
                                               size_t text_len, int add_bos, uint32_t *tokens,
                                               size_t capacity, size_t *n_tokens);

/** Decodes ids to UTF-8 text (tokenizer-and-prompt.md §3: control ids give nothing, invalid byte
 *  sequences become U+FFFD). Writes the text plus a NUL to `text` and its length (without the
 *  NUL) to *text_len. If `capacity` < length + 1, writes nothing, reports the length and returns
 *  BUFFER_TOO_SMALL. Returns NEEDLE_OK; INVALID_ARGUMENT (NULL model/text_len, NULL tokens with
 *  n_tokens > 0, an id >= vocab_size); UNSUPPORTED; BUFFER_TOO_SMALL. Any thread. */
NEEDLE_API needle_status needle_model_detokenize(const needle_model *model, const uint32_t *tokens,
                                                 size_t n_tokens, char *text, size_t capacity,
                                                 size_t *text_len);

/* ---------------------------------------------------------------- generation */

/** Why needle_generate stopped. */
#define NEEDLE_STOP_NONE 0         /* did not generate (an error happened first) */
#define NEEDLE_STOP_EOS 1          /* the model emitted EOS or <|im_end|> (not fed, not streamed) */
#define NEEDLE_STOP_MAX_TOKENS 2   /* max_tokens were generated */
#define NEEDLE_STOP_CONTEXT_FULL 3 /* the sequence reached max_seq_len */
#define NEEDLE_STOP_CALLBACK 4     /* the callback returned non-zero */

/** Generation options. Set struct_size, then needle_generate_params_init(). */
typedef struct needle_generate_params {
    uint32_t struct_size; /* sizeof(needle_generate_params), set by the caller before init; one
                             layout so far (needle_generate refuses a smaller struct_size) */
    uint32_t max_tokens; /* generated-token budget (default 128) */
    float temperature;   /* 0 (default) = greedy argmax, ties to the lowest id;
                            > 0 samples softmax(logits / temperature) */
    int32_t top_k;       /* keep the k most likely tokens; 0 (default) = all */
    float top_p;         /* keep the smallest set whose probability reaches top_p; 1 (default)=all */
    uint64_t seed;       /* sampling is deterministic for a seed (default 0) */
    int32_t add_bos;     /* 1 (default): prepend BOS when the state is at position 0 */
} needle_generate_params;

/** Fills `p` with defaults when the caller's p->struct_size (set it first) covers the struct;
 *  a smaller struct_size, or NULL, is ignored. */
NEEDLE_API void needle_generate_params_init(needle_generate_params *p);

/** Token id passed to the callback for the final flush (see needle_token_callback). */
#define NEEDLE_NO_TOKEN 0xFFFFFFFFu

/** Called once per generated token with the text it completes: `text` holds `text_len` bytes of
 *  whole UTF-8 code points (never half of one; it may be empty when a token only starts a
 *  multi-byte character, and is NUL-terminated). Valid only during the call. Return 0 to go on,
 *  non-zero to stop after this token. If generation ends inside a multi-byte character, one
 *  last call with token NEEDLE_NO_TOKEN delivers U+FFFD for it (its return value is ignored).
 *  The concatenated pieces equal needle_model_detokenize() of the generated ids. */
typedef int (*needle_token_callback)(uint32_t token, const char *text, size_t text_len,
                                     void *user_data);

/** Figures of one needle_generate call. Set struct_size before the call. */
typedef struct needle_generate_result {
    uint32_t struct_size;
    uint32_t prompt_tokens;    /* tokens fed from the prompt (including BOS) */
    uint32_t generated_tokens; /* tokens streamed to the callback */
    uint32_t stop_reason;      /* NEEDLE_STOP_* */
    double prefill_ms;         /* wall time of the prompt pass, milliseconds */
    double decode_ms;          /* wall time of the generation steps, milliseconds */
} needle_generate_result;

/** Tokenizes `prompt` (no chat template is applied), feeds it to the state after what the state
 *  already holds (BOS first when at position 0 and add_bos), then generates up to max_tokens,
 *  calling `callback` (may be NULL) per token. Each generated token but the stop token is fed to
 *  the state, so a later call continues the same sequence.
 *  While it runs the state is busy: from inside the callback, needle_state_decode,
 *  needle_state_prefill and needle_generate on the same state return INVALID_ARGUMENT ("state is
 *  busy in needle_generate"), needle_state_reset is ignored and needle_state_free is deferred
 *  until this call returns. Other states, the model and needle_state_pos may be used.
 *  `batch` (may be NULL) is used for the prompt pass. `params` and `result` may be NULL.
 *  Returns NEEDLE_OK (stopped on EOS, budget or context); NEEDLE_E_CANCELLED (the callback asked
 *  to stop: the state is valid and holds every streamed token); INVALID_ARGUMENT (NULL state,
 *  NULL prompt with prompt_len > 0, invalid UTF-8, bad sampling parameters, a batch of another
 *  model, nothing to feed: an empty prompt and no BOS); UNSUPPORTED (no tokenizer);
 *  CONTEXT_FULL (the prompt does not fit with room for one generated token: nothing is fed).
 *  The context is the state's needle_state_params.max_tokens when set, else max_seq_len:
 *  generation stops with NEEDLE_STOP_CONTEXT_FULL when the state holds that many positions. */
NEEDLE_API needle_status needle_generate(needle_state *state, needle_batch *batch,
                                         const char *prompt, size_t prompt_len,
                                         const needle_generate_params *params,
                                         needle_token_callback callback, void *user_data,
                                         needle_generate_result *result);

/* ---------------------------------------------------------------- probe heads and state persistence (issue 9) */

/** Confidence head (model-v2.md §7.3 code 2; Needle 3: model-v3.md §2.4): writes
 *  *probability = σ(head logit) over every position the state has been fed (PAD excluded),
 *  pooled while the positions were fed, with the state's own attention (window) as head window.
 *  Returns INVALID_ARGUMENT (NULL argument, or nothing fed yet); UNSUPPORTED (the model has no
 *  confidence head, or the state was created with needle_state_params.probe_heads 0).
 *  Allocates nothing. */
NEEDLE_API needle_status needle_state_confidence(const needle_state *state, float *probability);

/** Contrastive head (model-v2.md §7.3 code 1): the unit embedding [dim] of every position the
 *  state has been fed, written to out[0..dim) (dim 128 for needle2); *dim is set whenever the
 *  model has the head. Similarity of two embeddings is their dot product.
 *  Returns INVALID_ARGUMENT (NULL state or dim, NULL out with out_len > 0, nothing fed yet);
 *  BUFFER_TOO_SMALL (out_len < dim: nothing written to out); UNSUPPORTED (no contrastive head,
 *  or the state was created with needle_state_params.probe_heads 0). */
NEEDLE_API needle_status needle_state_embedding(const needle_state *state, float *out, size_t out_len,
                                                size_t *dim);

/** Makes dst continue exactly as src would (position, KV cache, Engram history, head pooling;
 *  Needle 3 also its Q/K/V conv tails). Both states must come from the same model handle's model
 *  with equal options (kv_window, kv_type, max_tokens). Allocates nothing. Returns
 *  INVALID_ARGUMENT (NULL, different model or options). */
NEEDLE_API needle_status needle_state_copy(needle_state *dst, const needle_state *src);

/** Serialises the state into buf[cap]: a versioned, checksummed blob tied to the model file's
 *  fingerprint and the state's options; only the memory the position uses is stored (bytes grow
 *  with the position up to the KV window). *len is set to the blob size in every case but a NULL
 *  argument. Returns INVALID_ARGUMENT (NULL state or len, NULL buf with cap > 0);
 *  BUFFER_TOO_SMALL (cap < *len: nothing written). */
NEEDLE_API needle_status needle_state_save(const needle_state *state, void *buf, size_t cap, size_t *len);

/** Replaces the state's contents with a blob of needle_state_save. The whole blob is checked
 *  first: FORMAT (damaged, truncated, another version, another model file or other options, or
 *  a position beyond this state's max_tokens; the state is unchanged); INVALID_ARGUMENT (NULL
 *  state, NULL buf with len > 0). */
NEEDLE_API needle_status needle_state_load(needle_state *state, const void *buf, size_t len);

/* ---------------------------------------------------------------- tool-calling chat (issue 9) */

/* One tool-calling conversation (shared/spec/tool-calling.md): a model, the system facts, the
 * tools (a JSON array of schemas) and the transcript. Each complete() runs one turn: renders the
 * Needle chat template (§3), prefills what the model has not seen, decodes greedily with the
 * call payload constrained by a grammar compiled from the schemas (§6), and writes the JSON
 * response envelope (§7). Use one chat from one thread at a time; it keeps its model alive. */
typedef struct needle_chat needle_chat;

/** tool_choice values (needle_chat_params.tool_choice). */
#define NEEDLE_TOOL_CHOICE_AUTO 0     /* the model decides (default) */
#define NEEDLE_TOOL_CHOICE_REQUIRED 1 /* the turn starts with <tool_call>; on a query turn the
                                         list must be non-empty (a tool-result turn may still
                                         answer [] so an agent loop can finish) */
#define NEEDLE_TOOL_CHOICE_NONE 2     /* no call: <tool_call> is masked; type "respond" */

/** validation values (needle_chat_params.validation), spec §7.3 [C]. With ANNOTATE or
 *  SUPPRESS, a turn whose output parsed into at least one call gets a last envelope field
 *  "validation": {"ungrounded": ["tool.arg", ...], "negation": bool}: ungrounded lists the
 *  arguments holding a number the user's text (every turn since the static prefix) states
 *  neither in digits nor in English number words; negation says the text has a negation word.
 *  SUPPRESS also moves each call with an ungrounded argument, when the text states no number at
 *  all, from function_calls to suppressed_calls as {"name", "arguments", "reason"}; the turn
 *  stays success true. Negation alone never suppresses. */
#define NEEDLE_VALIDATION_OFF 0       /* default (the spec: optional, default-off) */
#define NEEDLE_VALIDATION_SUPPRESS 1  /* annotate and withhold invented values */
#define NEEDLE_VALIDATION_ANNOTATE 2  /* the validation field only; never withholds */

/** Options of needle_chat_create. Set struct_size, then needle_chat_params_init(); fields are
 *  read up to struct_size (later fields keep their defaults for a shorter struct). */
typedef struct needle_chat_params {
    uint32_t struct_size;     /* sizeof(needle_chat_params), set by the caller before init; the
                                 first layout ended after stop_needs_call (24 bytes) */
    int32_t tool_choice;      /* NEEDLE_TOOL_CHOICE_*, default AUTO */
    int32_t kv_type;          /* needle_kv_type of the conversation's state, default F32 */
    int32_t grammar;          /* 1 (default): constrained decoding inside <tool_call> (§6);
                                 0: free decoding, the payload is validated afterwards */
    int32_t require_required; /* 1 (default): an arguments object closes only once every
                                 "required" key appeared (§6.4 switch) */
    int32_t stop_needs_call;  /* 1 (default): EOS and <|im_end|> are masked until a call list
                                 has closed (§6.3 switch) */
    int32_t sinks;            /* 1 (default): the static prefix stays visible as KV sinks however
                                 long the conversation (§10.3); 0: plain window (upstream's
                                 public reference). Added after the first layout: a
                                 struct_size that ends before it means 1 */
    int32_t validation;       /* NEEDLE_VALIDATION_*, default OFF: the serving layer's call
                                 validation (§7.3 [C]); see the constants above. Added after
                                 sinks: a struct_size that ends before it means OFF */
    const char *tool_index_path; /* NULL (default): with more than five tools, every tool is
                                 embedded at create and nothing is written. Else the tool index
                                 file (§9, format in src/chat/retrieval.h): entries that match
                                 the model's fingerprint and a tool's canonical text are loaded,
                                 the others embedded, and the file rewritten atomically when it
                                 does not list exactly the current tools; a stale, damaged or
                                 foreign file is rebuilt. Unused with five tools or fewer or a
                                 model without the contrastive head. Copied at create. Added after
                                 validation: a struct_size that ends before it means NULL */
} needle_chat_params;

/** Tool retrieval engages above this many tools; that many are rendered per turn (§9). */
#define NEEDLE_CHAT_RETRIEVAL_K 5
/** Most tools needle_chat_create accepts (a longer list is INVALID_ARGUMENT). */
#define NEEDLE_CHAT_MAX_TOOLS 1024

/** Fills `p` with defaults, only the fields within the caller's p->struct_size (set it first);
 *  struct_size < 24 or NULL is ignored. */
NEEDLE_API void needle_chat_params_init(needle_chat_params *p);

/** Starts a conversation. `system` (NULL = "") is inserted raw in the system turn (omitted when
 *  empty); `tools_json` (NULL = "[]") is parsed and re-serialised canonically (§3.3). The static
 *  prefix (BOS through the closing </tools>) is prefilled by the first turn and a copy of that
 *  state is kept, so reset() never prefills it again.
 *  Tool retrieval (§9): with more than NEEDLE_CHAT_RETRIEVAL_K tools and a model with the
 *  contrastive head, every tool is embedded here (or read from tool_index_path) and each query
 *  turn renders, and constrains the call to, the NEEDLE_CHAT_RETRIEVAL_K best tools in
 *  declaration order; a tool-result turn keeps the previous turn's selection. Without the head
 *  every tool is rendered.
 *  Cost: linear in the size of tools_json. At most NEEDLE_CHAT_MAX_TOOLS tools (counted before
 *  parsing); the block must be able to fit the context (without retrieval: all tools; with it:
 *  the NEEDLE_CHAT_RETRIEVAL_K largest), checked before any grammar or embedding work.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL model/out, bad params, invalid JSON or UTF-8, not
 *  an array, more than NEEDLE_CHAT_MAX_TOOLS tools, a tool that is not an object or has no
 *  string "name", tool_choice REQUIRED with no tool, a bad validation value; and schemas no
 *  value can satisfy: an empty name, "enum": [], minimum > maximum (exclusive forms too; no
 *  integer in an integer range; an integer or number range with no value of at most 15 digits,
 *  which is what the grammar writes: e.g. "minimum": 1e19), minLength > maxLength, minItems > maxItems, an invalid or too
 *  complex "pattern" (> 4096 bytes, groups nested > 64, or a {n,m} count above 500) or one
 *  matching no string: the
 *  message says "tool I ("NAME"): PATH: problem". Duplicate names are accepted (§6.4: the
 *  first is the grammar's)); CONTEXT_FULL (the static prefix leaves fewer than 256 positions
 *  before max_seq_len); UNSUPPORTED (no tokenizer or chat markers); IO (tool_index_path cannot
 *  be written, or is not a regular file: a FIFO is refused at once, never waited on); NO_MEMORY. *out is NULL on
 *  failure. */
NEEDLE_API needle_status needle_chat_create(needle_model *model, const char *system,
                                            const char *tools_json, const needle_chat_params *p,
                                            needle_chat **out);

/** The exact UTF-8 text the next complete(text) would feed (no BOS): the whole prompt on the
 *  first turn, else the later-turn rendering (§10.2, starting with the previous turn's
 *  <|im_end|>). With retrieval, a query's text selects the tools (one embedding pass, reused by
 *  the complete() of the same text); on a first turn that selection becomes the chat's (what
 *  needle_chat_static_prefix_tokens reports); a follow-up query that selects other tools renders
 *  the new static prefix, the conversation so far, then the turn (§10.3: what is re-fed). Writes it plus a NUL; *len = its length without the NUL. If cap < len + 1,
 *  writes nothing, reports *len and returns BUFFER_TOO_SMALL (out may be NULL with cap 0).
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL chat/text/len, invalid UTF-8); BUFFER_TOO_SMALL. */
NEEDLE_API needle_status needle_chat_render(needle_chat *chat, const char *text, char *out,
                                            size_t cap, size_t *len);

/** One turn on `text` (a query, or tool results as JSON after a turn that returned calls):
 *  writes the NUL-terminated envelope of §7 (fields type, success, error, error_code, reason,
 *  function_calls, suppressed_calls, reasoning, confidence, prefill_tps, decode_tps,
 *  peak_ram_mb, in that order, then "validation" when params.validation is on and the output
 *  held a call) and *len = its length without the NUL (len may be NULL).
 *  Failures of the turn itself (invalid UTF-8, context full, truncation, schema violation) are
 *  envelopes with success false and NEEDLE_OK. If the envelope does not fit `cap`, writes the
 *  minimal envelope with error_code "buffer_too_small" when that fits (else "" when cap >= 1),
 *  sets *len to the full envelope's length and returns BUFFER_TOO_SMALL; the turn still counts.
 *  Returns NEEDLE_OK; INVALID_ARGUMENT (NULL chat/text/out, cap < 2, max_new_tokens 0);
 *  BUFFER_TOO_SMALL; NO_MEMORY; INTERNAL. */
NEEDLE_API needle_status needle_chat_complete(needle_chat *chat, const char *text,
                                              uint32_t max_new_tokens, char *out, size_t cap,
                                              size_t *len);

/** Rewinds the conversation to the cached static prefix; tools and system stay. NULL ignored. */
NEEDLE_API void needle_chat_reset(needle_chat *chat);

/** Frees a chat. NULL is ignored. */
NEEDLE_API void needle_chat_free(needle_chat *chat);

/** The canonical tools JSON placed between <tools> and </tools> (§3.3), with the buffer rules of
 *  needle_chat_render. Returns NEEDLE_OK; INVALID_ARGUMENT; BUFFER_TOO_SMALL. */
NEEDLE_API needle_status needle_chat_tools_json(const needle_chat *chat, char *out, size_t cap,
                                                size_t *len);

/** Tokens of the static prefix (BOS included; the KV-sink / prefix-cache region, §10.3); with
 *  retrieval, that of the current selection (0 before the first render or turn).
 *  Returns NEEDLE_OK or INVALID_ARGUMENT (NULL arguments). */
NEEDLE_API needle_status needle_chat_static_prefix_tokens(const needle_chat *chat, uint32_t *n_tokens);

/** Figures of the last needle_chat_complete turn (debug and benchmarks). Set struct_size. */
typedef struct needle_chat_stats {
    uint32_t struct_size;
    uint32_t prefill_tokens;   /* tokens run through the model before the first generated one */
    uint32_t generated_tokens; /* stop token excluded */
    uint32_t call_tokens;      /* generated after <tool_call>, through </tool_call> */
    double prefill_ms, decode_ms; /* wall time; decode_ms includes grammar_ms */
    double grammar_ms;         /* token masks and automaton steps inside the call */
    double p_decode;           /* confidence part: exp(mean log p) of the call tokens (§8) */
    double p_head;             /* confidence part: the confidence head (-1: not available) */
} needle_chat_stats;

/** Writes the last turn's figures (zeros before the first turn). Returns NEEDLE_OK or
 *  INVALID_ARGUMENT (NULL arguments, struct_size smaller than this struct). */
NEEDLE_API needle_status needle_chat_last_stats(const needle_chat *chat, needle_chat_stats *stats);

/* ---------------------------------------------------------------- upstream-compatible API (issue 9) */

/* The four calls of upstream's libneedle (tokenizer-and-prompt.md §7), with its exact
 * signatures, over ONE process-wide chat. Calls serialize on a mutex (any thread; concurrent
 * callers wait). Negative returns are -(needle_status) (e.g. -1 invalid argument, -7 buffer too
 * small); needle_last_error() of the calling thread has the message. */

/** Loads the model from `size` bytes of a .cact container (copied; the caller may free them).
 *  Replaces an earlier model and ends the current conversation (call needle_init again).
 *  Returns 0, or a negative code (NULL blob, damaged or unsupported container). */
NEEDLE_API int needle_load(const char *blob, uint64_t size);

/** Binds system facts (NULL = "") and tools (NULL = "[]") and starts a new conversation, as
 *  needle_chat_create with default params and `tool_index_path` (NULL: not persisted; see
 *  needle_chat_params.tool_index_path). Without needle_load the model is the file named by the
 *  environment variable NEEDLE_MODEL (loaded once), else the built-in demo model
 *  (needle_model_load_builtin; a build without one returns -NEEDLE_E_INVALID_ARGUMENT).
 *  Returns 0, or a negative code (no model, bad JSON/schema, static prefix too long, ...). */
NEEDLE_API int needle_init(const char *system, const char *tools_json, const char *tool_index_path);

/** One turn of the process-wide conversation, as needle_chat_complete: writes the
 *  NUL-terminated envelope into out_buf and returns 0 (also for success:false envelopes).
 *  Negative: no needle_init yet, NULL text/out_buf, out_buf_size < 2, max_new_tokens < 1, or the
 *  envelope did not fit out_buf_size (then out_buf holds the minimal "buffer_too_small" envelope
 *  if that fits, else ""). */
NEEDLE_API int needle_complete(const char *text, int max_new_tokens, char *out_buf, int out_buf_size);

/** Rewinds the process-wide conversation (keeps model, tools and system). No-op before init. */
NEEDLE_API void needle_reset(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NEEDLE_H */
