#include "core/parallel.h"

#include "core/team.h"

#if NEEDLE_WITH_TBB
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#endif

namespace needle {

#if NEEDLE_WITH_TBB

void parallel_for(uint32_t begin, uint32_t end, uint32_t grain, FunctionRef<void(uint32_t, uint32_t)> body) {
    if (begin >= end) return;
    if (Team::in_chunk()) return body(begin, end);
    if (Team *team = Team::current()) return team->run(begin, end, grain, body);
    tbb::parallel_for(tbb::blocked_range<uint32_t>(begin, end, grain ? grain : 1),
                      [&](const tbb::blocked_range<uint32_t> &r) { body(r.begin(), r.end()); });
}

ThreadCap::ThreadCap(int max_threads)
    : impl_(new tbb::global_control(tbb::global_control::max_allowed_parallelism,
                                    size_t(max_threads > 0 ? max_threads : 1))) {}
ThreadCap::~ThreadCap() { delete static_cast<tbb::global_control *>(impl_); }

#else  // one thread per state: the whole range on the caller

void parallel_for(uint32_t begin, uint32_t end, uint32_t, FunctionRef<void(uint32_t, uint32_t)> body) {
    if (begin < end) body(begin, end);
}

ThreadCap::ThreadCap(int) {}
ThreadCap::~ThreadCap() = default;

#endif

}  // namespace needle
