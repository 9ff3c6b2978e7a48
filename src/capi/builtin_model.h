// The demo model compiled into libneedle (CMake option NEEDLE_BUILTIN_MODEL, issue 10). The
// arrays are generated at build time from models/needle-demo.cact and
// models/needle-demo.tools.json by cmake/embed_builtin_model.cmake; they exist only when the
// library is built with NEEDLE_HAVE_BUILTIN_MODEL.
#pragma once

#include <cstddef>

namespace needle::builtin {
extern const unsigned char model_bytes[];  // the .cact container, model_size bytes
extern const std::size_t model_size;
extern const char tools_json[];            // the tools it was trained for, NUL-terminated
}  // namespace needle::builtin
