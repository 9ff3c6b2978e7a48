// The C handles' definitions, shared by the C shim's files (needle_api.cpp, state_api.cpp).
#pragma once

#include <memory>

#include "generate/generate.h"
#include "model/model.h"
#include "needle.h"

struct needle_model {
    std::shared_ptr<const needle::Model> m;
};

struct needle_state {
    std::shared_ptr<const needle::Model> model;
    std::unique_ptr<needle::Sequence> seq;
    std::unique_ptr<needle::Workspace> step;  // scratch of one decode step
    std::unique_ptr<needle::Generator> gen;
    // Set while needle_generate runs on this state: calls on it from the token callback are
    // refused (busy_error), and a needle_state_free from there is carried out when it returns.
    bool busy = false;
    bool free_pending = false;
};

struct needle_batch {
    std::shared_ptr<const needle::Model> model;
    std::unique_ptr<needle::Workspace> ws;
};

namespace needle {
namespace capi {
// Sets the thread's last error (needle_last_error) to msg and returns code.
needle_status set_last_error(needle_status code, const char *msg);
}  // namespace capi
}  // namespace needle
