// Task arenas for sequences: each live sequence holds one arena of its own, leased from a
// process-wide pool and given back (not destroyed) when the sequence dies. Include
// core/parallel.h (which includes this) rather than this file.
//
// Why a pool: oneTBB 2021.8 keeps about 7 KB for every destroyed arena that worker threads have
// joined, so creating and freeing states in a loop would grow memory without bound. Reusing
// arenas bounds that by the largest number of sequences ever alive at once. And since giving an
// arena back never calls into TBB, a state may be freed from any thread at any time, including
// a garbage collector's finalizer while the process exits.
//
// Without TBB (NEEDLE_WITH_TBB=OFF) a lease holds nothing and execute() runs on the caller.
#pragma once

namespace needle {

template <class Sig>
class FunctionRef;

// The worker count a model or arena really runs with (needle.h, needle_model_params.n_threads):
// 0 = all cores; anything above the cores this process may use (its CPU affinity), or above a
// host's tbb::global_control::max_allowed_parallelism, is clamped to that. oneTBB never sees a
// larger request: past ~2^29 slots its arena allocation overflows (SIGSEGV), and any request above
// its worker limit makes it print a warning to stderr. Negative counts are treated as 0.
int clamp_threads(int n_threads);

class ArenaLease {
public:
    ArenaLease() = default;
    // An arena of clamp_threads(n_threads) slots (ignored without TBB). Throws std::bad_alloc.
    explicit ArenaLease(int n_threads);
    ArenaLease(ArenaLease &&other) noexcept;
    ArenaLease &operator=(ArenaLease &&other) noexcept;
    ArenaLease(const ArenaLease &) = delete;
    ArenaLease &operator=(const ArenaLease &) = delete;
    ~ArenaLease();  // gives the arena back to the pool; never throws, never calls TBB

    // Runs fn on the calling thread inside this arena: parallel_for in fn uses the arena's
    // threads. Exceptions from fn propagate. A default-constructed lease runs fn directly.
    void execute(FunctionRef<void()> fn) const;

    struct Arena;  // opaque: a tbb::task_arena, kept out of this header

private:
    void give_back() noexcept;
    Arena *arena_ = nullptr;
    int n_threads_ = 0;
};

}  // namespace needle
