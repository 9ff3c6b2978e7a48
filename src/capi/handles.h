// The C handles' definitions, shared by the C shim's files (needle_api.cpp, state_api.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

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
    std::vector<needle::Sequence *> seqs;  // [capacity]: the sequences of a needle_decode_many step
};

namespace needle {
namespace capi {
// Sets the thread's last error (needle_last_error) to msg and returns code.
needle_status set_last_error(needle_status code, const char *msg);

/** needle_model_load_memory with `fn` as the name its error messages give (the built-in model
 *  and upstream's needle_load report under their own names). */
needle_status load_memory(const char *fn, const void *data, size_t size, const needle_model_params *p,
                          needle_model **out);

// Byte offset just past field `f` of params struct `T`.
#define NEEDLE_FIELD_END(T, f) (offsetof(T, f) + sizeof(static_cast<T *>(nullptr)->f))

// The bytes of a caller's params struct that hold whole fields: the largest of `field_ends` (the
// end offsets of the struct's fields, the first one being the end of the FIRST layout) that is
// <= struct_size; 0 when struct_size ends before the first layout (that caller is refused).
inline size_t whole_field_bytes(uint32_t struct_size, std::initializer_list<size_t> field_ends) {
    size_t n = 0;
    for (size_t e : field_ends)
        if (e <= struct_size) n = e > n ? e : n;
    return n;
}

// A params struct of zeros with struct_size = sizeof(T), then `set` fills its defaults.
template <class T, class Set>
T params_defaults(Set &&set) {
    T d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    set(d);
    return d;
}

// The body of every needle_*_params_init (ABI rule of needle.h): writes the defaults `d` over the
// caller's `*p` for the fields that lie wholly within p->struct_size, which the caller set first,
// and nothing past it, so that a program built against an older, shorter struct never has this
// library write beyond its struct. struct_size itself is left as the caller set it; a struct_size
// below the first layout (or NULL p) is ignored.
template <class T>
void init_params(T *p, const T &d, std::initializer_list<size_t> field_ends) {
    if (!p) return;
    const size_t n = whole_field_bytes(p->struct_size, field_ends);
    if (n <= sizeof(uint32_t)) return;
    std::memcpy(reinterpret_cast<char *>(p) + sizeof(uint32_t), reinterpret_cast<const char *>(&d) + sizeof(uint32_t),
                n - sizeof(uint32_t));
}
}  // namespace capi
}  // namespace needle
