// A persistent thread team: the fork/join of the threaded build (core/parallel.h).
//
// Why not a oneTBB parallel_for per loop: a needle2 decode step is ~85 small parallel loops
// (the matmuls of each layer, attention per KV group), and a fork/join that moves cache lines
// between cores many times costs microseconds: on a 2-core Zen 5 VM a line takes ~300 ns from
// one core to the other (600 ns ping-pong), and TBB's fork/join or a chunk counter shared by
// the threads measured ~2.2 µs per loop. A team hands out a loop as one share per thread: the
// worker sees the epoch (one line) and works through its share on lines of its own; a thread
// done with its share steals the others' last sub-chunks (a slow, late or preempted thread
// costs little waiting), and the caller then reads one done word per worker. Workers poll for ~200 µs after a
// loop (yielding now and then, for an oversubscribed core), then sleep on a condition
// variable, so an idle library costs no CPU.
//
// A team is used by one caller at a time (ArenaLease::execute leases one from a pool for the
// duration of a call). Nested loops inside a loop body run inline on their thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace needle {

class Team {
public:
    // A team of n_threads (the caller counts as one): n_threads - 1 workers are started.
    // Throws std::system_error if a thread cannot be started (none is left running).
    explicit Team(int n_threads);
    ~Team();  // stops and joins the workers
    Team(const Team &) = delete;
    Team &operator=(const Team &) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // body(b, e) over disjoint ranges covering [begin, end) (one per thread, each >= grain
    // long but the last), on the caller and the workers; returns when every range has run. The
    // first exception a range throws is rethrown here (ranges not started by then are skipped,
    // as a cancelled oneTBB loop skips its remaining tasks).
    void run(uint32_t begin, uint32_t end, uint32_t grain, FunctionRef<void(uint32_t, uint32_t)> body);

    // Whether the calling thread is running a chunk of some team (nested loops run inline).
    static bool in_chunk();

    // The team parallel_for hands loops to on this thread, or null (oneTBB then).
    static Team *current();

    // While it lives, a team of n_threads from a process-wide pool of idle teams is current on
    // this thread (none for n_threads <= 1, or if threads cannot be started). Teams are not
    // destroyed but given back, so their threads are started once per concurrent caller.
    class Lease {
    public:
        explicit Lease(int n_threads) noexcept;
        ~Lease();
        Lease(const Lease &) = delete;
        Lease &operator=(const Lease &) = delete;

    private:
        Team *team_ = nullptr;
        Team *outer_ = nullptr;
    };

private:
    // Share k of a loop (thread k's part; 0 is the caller's), cut into at most kSubChunks
    // sub-chunks: `range` = epoch << 32 | front << 16 | back, the sub-chunks [front, back)
    // nobody has taken. The owner takes from the front; a thread done with its own share takes
    // from the back of the others'; each by CAS on that share's line, so an uneven split (a
    // slower core, a preempted thread, inputs in another core's cache) evens out, and in the
    // even case each thread's CASes stay on its own core.
    struct Share {
        alignas(64) std::atomic<uint64_t> range{0};
    };
    // Worker k's count of sub-chunks it finished in a loop: epoch << 32 | count.
    struct Done {
        alignas(64) std::atomic<uint64_t> word{0};
    };
    void worker_main(int index);
    void stop_workers();
    // Runs sub-chunk j of share k of the current loop (the caller of it has taken it).
    void run_sub(uint32_t k, uint32_t j);
    // Runs body(b, e) of the current loop on this thread; the first exception is kept.
    void run_range(uint32_t b, uint32_t e);
    // Takes a sub-chunk of share k in loop `epoch` from its front or back into *j; false if
    // none is left (or the loop has moved on).
    bool take(uint32_t k, uint32_t epoch, bool front, uint32_t *j);
    // Thread `self`'s part of loop `epoch`: its share, then what is left of the others'.
    // Publishes its count of finished sub-chunks in *done (workers) and returns it.
    uint32_t drain(uint32_t self, uint32_t epoch, uint32_t shares, std::atomic<uint64_t> *done);

    // The loop being handed out: loop_ = epoch << 32 | shares, stored (release) after the
    // fields and the shares' ranges. Fields are read only by a thread that has taken a
    // sub-chunk of that epoch (so the caller cannot be writing the next loop's); atomics
    // (relaxed) so that no read of them is a data race in any interleaving.
    alignas(64) std::atomic<uint64_t> loop_{0};
    std::atomic<const FunctionRef<void(uint32_t, uint32_t)> *> body_{nullptr};
    std::atomic<uint32_t> begin_{0}, end_{0}, share_len_{1}, sub_len_{1};

    std::unique_ptr<Share[]> share_;  // [size()]
    std::unique_ptr<Done[]> done_;    // [size()]; 0 (the caller) unused
    alignas(64) std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;  // the first exception of the current loop (under mu_)
    std::mutex mu_;
    std::condition_variable wake_;  // workers sleep on it between loops
    std::vector<std::thread> workers_;
};

}  // namespace needle
