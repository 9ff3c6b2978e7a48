// C entry points of the probe heads and of state copy / save / load (issue 9 items 1-2).
// Translation only: the pooling lives in the model, the blob format in model/state_io.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "capi/handles.h"
#include "core/error.h"
#include "model/state_io.h"

namespace {

using needle::capi::set_last_error;

needle_status fail_with(needle_status code, const char *fn, const char *msg) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s: %s", fn, msg);
    return set_last_error(code, buf);
}

template <class F>
needle_status guarded(const char *fn, F &&f) noexcept {
    try {
        return f();
    } catch (const needle::Error &e) {
        return fail_with(e.code(), fn, e.what());
    } catch (const std::bad_alloc &) {
        return fail_with(NEEDLE_E_NO_MEMORY, fn, "out of memory");
    } catch (const std::exception &e) {
        return fail_with(NEEDLE_E_INTERNAL, fn, e.what());
    } catch (...) {
        return fail_with(NEEDLE_E_INTERNAL, fn, "unknown exception");
    }
}

bool same_options(const needle::SequenceOptions &a, const needle::SequenceOptions &b) {
    return a.kv_window == b.kv_window && a.kv_type == b.kv_type && a.sink_tokens == b.sink_tokens &&
           a.probe_heads == b.probe_heads && a.max_tokens == b.max_tokens;
}

}  // namespace

extern "C" {

needle_status needle_state_confidence(const needle_state *state, float *probability) {
    const char *fn = "needle_state_confidence";
    if (!state || !probability) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "state or probability is NULL");
    return guarded(fn, [&] {
        float logit = 0.0f;
        state->model->probe_head_output(*state->seq, needle::ProbeHead::Confidence, &logit);
        *probability = float(1.0 / (1.0 + std::exp(-double(logit))));
        return NEEDLE_OK;
    });
}

needle_status needle_state_embedding(const needle_state *state, float *out, size_t out_len, size_t *dim) {
    const char *fn = "needle_state_embedding";
    if (!state || !dim) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "state or dim is NULL");
    if (!out && out_len > 0) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "out is NULL but out_len > 0");
    const needle::Model &m = *state->model;
    const uint32_t d = m.probe_head_dim(needle::ProbeHead::Contrastive);
    if (d == 0) return fail_with(NEEDLE_E_UNSUPPORTED, fn, "this model has no contrastive head");
    *dim = d;
    if (out_len < d) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "out_len %zu < embedding dim %u", out_len, d);
        return fail_with(NEEDLE_E_BUFFER_TOO_SMALL, fn, msg);
    }
    return guarded(fn, [&] {
        m.probe_head_output(*state->seq, needle::ProbeHead::Contrastive, out);
        // §7.3: e = out / sqrt(Σ out² + 1e-12), the sum in double.
        double ss = 0.0;
        for (uint32_t i = 0; i < d; ++i) ss += double(out[i]) * double(out[i]);
        const double inv = 1.0 / std::sqrt(ss + 1e-12);
        for (uint32_t i = 0; i < d; ++i) out[i] = float(double(out[i]) * inv);
        return NEEDLE_OK;
    });
}

needle_status needle_state_copy(needle_state *dst, const needle_state *src) {
    const char *fn = "needle_state_copy";
    if (!dst || !src) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "dst or src is NULL");
    if (dst->busy) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "dst is busy in needle_generate (called from its token callback)");
    if (dst == src) return NEEDLE_OK;
    if (dst->model != src->model) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "the states belong to different models");
    if (!same_options(dst->seq->options, src->seq->options))
        return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "the states were created with different options");
    return guarded(fn, [&] {
        needle::copy_sequence(*dst->seq, *src->seq);
        return NEEDLE_OK;
    });
}

needle_status needle_state_save(const needle_state *state, void *buf, size_t cap, size_t *len) {
    const char *fn = "needle_state_save";
    if (!state || !len) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "state or len is NULL");
    if (!buf && cap > 0) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "buf is NULL but cap > 0");
    return guarded(fn, [&] {
        const size_t need = needle::saved_size(*state->model, *state->seq);
        *len = need;
        if (cap < need) {
            char msg[128];
            std::snprintf(msg, sizeof msg, "cap %zu < blob size %zu", cap, need);
            return fail_with(NEEDLE_E_BUFFER_TOO_SMALL, fn, msg);
        }
        needle::save_sequence(*state->model, *state->seq, static_cast<uint8_t *>(buf), cap);
        return NEEDLE_OK;
    });
}

needle_status needle_state_load(needle_state *state, const void *buf, size_t len) {
    const char *fn = "needle_state_load";
    if (!state) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "state is NULL");
    if (!buf && len > 0) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "buf is NULL but len > 0");
    if (state->busy) return fail_with(NEEDLE_E_INVALID_ARGUMENT, fn, "state is busy in needle_generate (called from its token callback)");
    static const uint8_t empty = 0;
    return guarded(fn, [&] {
        needle::load_sequence(*state->model, *state->seq, buf ? static_cast<const uint8_t *>(buf) : &empty, len);
        return NEEDLE_OK;
    });
}

}  // extern "C"
