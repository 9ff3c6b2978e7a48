// A persistent thread team: the fork/join of the threaded build (core/parallel.h).
//
// Why not a oneTBB parallel_for per loop: a needle2 decode step is ~85 small parallel loops
// (the matmuls of each layer, attention per KV group), and a fork/join that moves cache lines
// between cores many times costs microseconds: on a 2-core Zen 5 VM a line moves in ~150 ns,
// and TBB's fork/join (or a shared chunk counter) measured ~2.2 µs per loop. A team hands out
// a loop as one static share per thread: the worker sees the epoch (one line), claims its
// share on a line of its own, and marks it done; ~3 line transfers per loop. A share its
// worker has not claimed when the caller is done with its own is run by the caller (a tiny
// loop, or a preempted worker, costs no waiting). Workers poll for ~200 µs after a loop, then
// sleep on a condition variable, so an idle library costs no CPU.
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
    // One thread's part of a loop, on a cache line of its own. `state` = epoch << 1 | done: a
    // share is claimed (by its worker, or by the caller if the worker is late) by a CAS that
    // writes the loop's epoch, and marked done by setting bit 0.
    struct alignas(64) Share {
        std::atomic<uint64_t> state{0};
    };
    void worker_main(int index);
    void stop_workers();
    // Claims share k of loop `epoch` (if nobody has) and runs it; false if it was taken.
    bool claim_and_run(uint32_t k, uint32_t epoch);

    // The loop being handed out: loop_ = epoch << 32 | shares, stored (release) after the
    // fields, which are read only by a thread that has claimed a share of that epoch (so the
    // caller cannot be writing the next loop's). Atomics (relaxed) so that a late worker's read
    // of a field is not a data race even when its claim then fails.
    alignas(64) std::atomic<uint64_t> loop_{0};
    std::atomic<const FunctionRef<void(uint32_t, uint32_t)> *> body_{nullptr};
    std::atomic<uint32_t> begin_{0}, end_{0}, share_len_{1};

    std::unique_ptr<Share[]> share_;  // [size()]
    alignas(64) std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;  // the first exception of the current loop (under mu_)
    std::mutex mu_;
    std::condition_variable wake_;
    std::vector<std::thread> workers_;
};

}  // namespace needle
