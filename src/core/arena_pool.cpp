#include "core/arena_pool.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace needle {
namespace {

// Idle arenas by slot count. `free` of each count is reserved for every arena of that count
// ever made, so giving one back (push_back) never allocates and cannot throw.
struct Pool {
    std::mutex mu;
    std::map<int, std::vector<tbb::task_arena *>> idle;
};

// Never destroyed: a lease may be given back during or after static destruction (a host's
// finalizer thread at exit), so the pool outlives every static. Reachable, so not a leak to LSan.
Pool &pool() {
    static Pool *p = new Pool;
    return *p;
}

}  // namespace

ArenaLease::ArenaLease(int n_threads) : n_threads_(n_threads > 0 ? n_threads : 0) {
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    std::vector<tbb::task_arena *> &idle = p.idle[n_threads_];
    if (!idle.empty()) {
        arena_ = idle.back();
        idle.pop_back();
        return;
    }
    // Room for this arena's return before it exists, so the destructor never allocates.
    idle.reserve(idle.capacity() + 1);
    arena_ = new tbb::task_arena(n_threads_ > 0 ? n_threads_ : int(tbb::task_arena::automatic));
}

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

void ArenaLease::give_back() noexcept {
    if (!arena_) return;
    Pool &p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    p.idle[n_threads_].push_back(std::exchange(arena_, nullptr));
}

}  // namespace needle
