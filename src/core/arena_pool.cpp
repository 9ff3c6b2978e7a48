#include "core/parallel.h"  // first: defines NEEDLE_WITH_TBB

#include <utility>

#if NEEDLE_WITH_TBB
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstddef>

#include <map>
#include <mutex>
#include <vector>

#include "core/team.h"
#endif

namespace needle {

#if NEEDLE_WITH_TBB

struct ArenaLease::Arena {
    explicit Arena(int n) : a(n > 0 ? n : int(tbb::task_arena::automatic)) {}
    tbb::task_arena a;
};

namespace {

// Idle arenas by slot count. `free` of each count is reserved for every arena of that count
// ever made, so giving one back (push_back) never allocates and cannot throw.
struct Pool {
    std::mutex mu;
    std::map<int, std::vector<ArenaLease::Arena *>> idle;
};

// Never destroyed: a lease may be given back during or after static destruction (a host's
// finalizer thread at exit), so the pool outlives every static. Reachable, so not a leak to LSan.
Pool &pool() {
    static Pool *p = new Pool;
    return *p;
}

}  // namespace

int clamp_threads(int n_threads) {
    const size_t cores = size_t(std::max(1, tbb::info::default_concurrency()));
    const size_t allowed = std::max<size_t>(
        1, tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    const int limit = int(std::min(cores, allowed));
    return n_threads <= 0 ? limit : std::min(n_threads, limit);
}

// Always an explicit slot count: an arena of exactly the default concurrency is the one request
// oneTBB 2021.8 never warns about, and the pool key is the count the arena really has.
ArenaLease::ArenaLease(int n_threads) : n_threads_(clamp_threads(n_threads)) {
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    std::vector<Arena *> &idle = p.idle[n_threads_];
    if (!idle.empty()) {
        arena_ = idle.back();
        idle.pop_back();
        return;
    }
    // Room for this arena's return before it exists, so the destructor never allocates.
    idle.reserve(idle.capacity() + 1);
    arena_ = new Arena(n_threads_);
}

void ArenaLease::execute(FunctionRef<void()> fn) const {
    // The forward pass's loops go to a thread team (core/team.h); the arena runs them only
    // when no team could be had or NEEDLE_TEAM=0 asked for oneTBB.
    Team::Lease team(n_threads_);
    if (arena_ && !Team::current())
        arena_->a.execute([&] { fn(); });
    else
        fn();
}

void ArenaLease::give_back() noexcept {
    if (!arena_) return;
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    p.idle[n_threads_].push_back(std::exchange(arena_, nullptr));
}

#else  // no arenas: every lease is empty and work runs on the caller

struct ArenaLease::Arena {};

// Without TBB every state runs on its caller: one thread, whatever was asked.
int clamp_threads(int) { return 1; }

ArenaLease::ArenaLease(int) : n_threads_(1) {}
void ArenaLease::execute(FunctionRef<void()> fn) const { fn(); }
void ArenaLease::give_back() noexcept { arena_ = nullptr; }

#endif

ArenaLease::ArenaLease(ArenaLease &&other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)), n_threads_(other.n_threads_) {}

ArenaLease &ArenaLease::operator=(ArenaLease &&other) noexcept {
    if (this != &other) {
        give_back();
        arena_ = std::exchange(other.arena_, nullptr);
        n_threads_ = other.n_threads_;
    }
    return *this;
}

ArenaLease::~ArenaLease() { give_back(); }

}  // namespace needle
