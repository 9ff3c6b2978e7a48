// Handle types and error plumbing shared by the C shim's source files (needle_api.cpp and the
// per-topic *_api.cpp). Internal: not part of the ABI.
#pragma once

#include <memory>

#include "model/model.h"
#include "needle.h"

struct needle_model {
    std::shared_ptr<const needle::Model> m;
};

namespace needle {
namespace capi {
// Sets the calling thread's needle_last_error() message and returns `code`.
needle_status set_error(needle_status code, const char *msg);
}  // namespace capi
}  // namespace needle
