// The engine's only view of threading. Every parallel loop and every per-sequence arena goes
// through here, so nothing else names oneTBB or the thread team, and `-DNEEDLE_WITH_TBB=OFF`
// swaps the whole implementation (parallel.cpp, arena_pool.cpp; team.cpp is compiled out).
//
// Contract kept by both builds: parallel_for splits [begin, end) into disjoint subranges and
// calls body once per subrange; callers only split independent work (rows, heads, positions),
// so results do not depend on the split: the no-TBB build gives the same bits, on one thread.
#pragma once

#include <cstdint>

#include "core/arena_pool.h"

// CMakeLists.txt defines it 0 or 1 (option NEEDLE_WITH_TBB); builds outside CMake get TBB.
#ifndef NEEDLE_WITH_TBB
#define NEEDLE_WITH_TBB 1
#endif

namespace needle {

// A borrowed callable (no allocation, no ownership): valid while the referenced callable lives.
template <class Sig>
class FunctionRef;

template <class R, class... A>
class FunctionRef<R(A...)> {
public:
    template <class Fn>
    FunctionRef(const Fn &fn)  // NOLINT: implicit, like a lambda passed to std::function
        : ctx_(&fn), call_([](const void *c, A... a) -> R { return (*static_cast<const Fn *>(c))(a...); }) {}
    R operator()(A... a) const { return call_(ctx_, a...); }

private:
    const void *ctx_;
    R (*call_)(const void *, A...);
};

// Calls body(b, e) for disjoint [b, e) covering [begin, end), each at least `grain` long unless
// the range is shorter. In the threaded build, inside ArenaLease::execute (a state's forward
// pass) the subranges are one per thread of the caller's team (core/team.h); elsewhere (model
// load) oneTBB's default arena runs them; inside a subrange, nested loops run inline. Without
// TBB: on the caller as one call body(begin, end). Exceptions from body propagate to the
// caller. grain 0 is taken as 1.
void parallel_for(uint32_t begin, uint32_t end, uint32_t grain, FunctionRef<void(uint32_t, uint32_t)> body);

// Caps the worker threads of the whole process while it lives (TSan runs of the threading
// tests, see tests/test_threads.cpp); a no-op without TBB.
class ThreadCap {
public:
    explicit ThreadCap(int max_threads);
    ~ThreadCap();
    ThreadCap(const ThreadCap &) = delete;
    ThreadCap &operator=(const ThreadCap &) = delete;

private:
    void *impl_ = nullptr;
};

// Whether this build runs work on more than one thread (false for NEEDLE_WITH_TBB=OFF).
constexpr bool kThreaded = NEEDLE_WITH_TBB != 0;

}  // namespace needle
