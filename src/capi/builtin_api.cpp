// The built-in demo model (issue 10): models/needle-demo.cact compiled into libneedle when the
// CMake option NEEDLE_BUILTIN_MODEL is on (the default). Used by needle_init when neither
// needle_load nor NEEDLE_MODEL gave a model, and by needle-run without --model.
#include "capi/handles.h"
#include "needle.h"

#if NEEDLE_HAVE_BUILTIN_MODEL
#include "capi/builtin_model.h"
#endif

extern "C" {

needle_status needle_model_load_builtin(const needle_model_params *p, needle_model **out) {
    if (out) *out = nullptr;
    if (!out) return needle::capi::set_last_error(NEEDLE_E_INVALID_ARGUMENT, "needle_model_load_builtin: out is NULL");
#if NEEDLE_HAVE_BUILTIN_MODEL
    return needle::capi::load_memory("needle_model_load_builtin", needle::builtin::model_bytes,
                                     needle::builtin::model_size, p, out);
#else
    (void)p;
    return needle::capi::set_last_error(NEEDLE_E_UNSUPPORTED,
                                        "needle_model_load_builtin: built with NEEDLE_BUILTIN_MODEL=OFF");
#endif
}

const char *needle_builtin_tools_json(void) {
#if NEEDLE_HAVE_BUILTIN_MODEL
    return needle::builtin::tools_json;
#else
    return nullptr;
#endif
}

}  // extern "C"
