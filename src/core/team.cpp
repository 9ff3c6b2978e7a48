#include "core/team.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Only the threaded build has a team (NEEDLE_WITH_TBB=OFF runs every state on its caller).
#if NEEDLE_WITH_TBB
namespace needle {

namespace {

thread_local bool tl_in_chunk = false;
thread_local Team *tl_team = nullptr;

// Idle teams by size. Never destroyed (a lease may end during static destruction); at exit
// (or dlclose of the library) `Shutdown` stops the idle ones, so no worker runs our code after
// it is unmapped.
struct TeamPool {
    std::mutex mu;
    std::vector<std::pair<int, Team *>> idle;
    size_t made = 0;  // teams ever started: idle has room for all of them
    bool closed = false;
};
TeamPool &team_pool() {
    static TeamPool *p = new TeamPool;
    return *p;
}
struct Shutdown {
    ~Shutdown() {
        TeamPool &p = team_pool();
        std::vector<std::pair<int, Team *>> idle;
        {
            std::lock_guard<std::mutex> lock(p.mu);
            p.closed = true;
            idle.swap(p.idle);
        }
        for (auto &t : idle) delete t.second;
    }
} shutdown;

// One spin-wait hint: lets the sibling hyper-thread run and saves power while polling.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
    asm volatile("yield" ::: "memory");
#endif
}

// How long a worker polls for the next loop before it sleeps: longer than the gaps between the
// loops of a forward pass (a few µs of per-position work), far shorter than a human pause.
constexpr auto kSpin = std::chrono::microseconds(200);

// Sub-chunks per worker share: enough to even out a split, few enough that the worker's CASes
// (local to its core until the caller steals) cost nothing.
constexpr uint32_t kSubChunks = 8;



// The loop word: epoch << 32 | number of shares, so a worker sees both at once.
uint32_t epoch_of(uint64_t loop) { return uint32_t(loop >> 32); }
uint32_t shares_of(uint64_t loop) { return uint32_t(loop); }

}  // namespace

bool Team::in_chunk() { return tl_in_chunk; }
Team *Team::current() { return tl_team; }

Team::Lease::Lease(int n_threads) noexcept : outer_(tl_team) {
    static const bool enabled = [] {
        const char *e = std::getenv("NEEDLE_TEAM");
        return !(e && e[0] == '0' && e[1] == 0);
    }();
    if (n_threads <= 1 || !enabled) return;
    TeamPool &p = team_pool();
    {
        std::lock_guard<std::mutex> lock(p.mu);
        if (p.closed) return;
        for (size_t i = p.idle.size(); i-- > 0;)
            if (p.idle[i].first == n_threads) {
                team_ = p.idle[i].second;
                p.idle.erase(p.idle.begin() + long(i));
                break;
            }
        // Room for this team's return, so the destructor never allocates.
        if (!team_) {
            try {
                p.idle.reserve(p.made + 1);
                team_ = new Team(n_threads);
                ++p.made;
            } catch (...) {
                team_ = nullptr;  // no threads to be had: oneTBB's arena runs the loops
                return;
            }
        }
    }
    tl_team = team_;
}

Team::Lease::~Lease() {
    tl_team = outer_;
    if (!team_) return;
    TeamPool &p = team_pool();
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.closed) return;  // exiting: leave it (its threads sleep)
    p.idle.emplace_back(team_->size(), team_);
}

Team::Team(int n_threads)
    : share_(new Share[size_t(std::max(1, n_threads))]), done_(new Done[size_t(std::max(1, n_threads))]) {
    const int workers = std::max(0, n_threads - 1);
    workers_.reserve(size_t(workers));
    try {
        for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_main(i); });
    } catch (...) {
        stop_workers();  // the ones started
        throw;
    }
}

Team::~Team() { stop_workers(); }

void Team::stop_workers() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_.store(true, std::memory_order_seq_cst);
    }
    wake_.notify_all();
    for (std::thread &t : workers_)
        if (t.joinable()) t.join();
    workers_.clear();
}

void Team::run_sub(uint32_t k, uint32_t j) {
    const uint32_t share_len = share_len_.load(std::memory_order_relaxed);
    const uint32_t sub_len = sub_len_.load(std::memory_order_relaxed);
    const uint32_t end = end_.load(std::memory_order_relaxed);
    const uint32_t share_begin = begin_.load(std::memory_order_relaxed) + k * share_len;
    const uint32_t b = share_begin + j * sub_len;
    run_range(b, std::min({end, share_begin + share_len, b + sub_len}));
}

void Team::run_range(uint32_t b, uint32_t e) {
    if (failed_.load(std::memory_order_relaxed)) return;
    const bool outer = tl_in_chunk;
    tl_in_chunk = true;
    try {
        (*body_.load(std::memory_order_relaxed))(b, e);
    } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!failed_.load(std::memory_order_relaxed)) {
            error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
    tl_in_chunk = outer;
}

bool Team::take(uint32_t k, uint32_t epoch, bool front, uint32_t *j) {
    std::atomic<uint64_t> &range = share_[k].range;
    uint64_t cur = range.load(std::memory_order_acquire);
    for (;;) {
        const uint32_t f = uint32_t(cur >> 16) & 0xFFFFu, b = uint32_t(cur) & 0xFFFFu;
        // A loop that moved on (its range was rewritten) or nothing left: none.
        if (epoch_of(cur) != epoch || f >= b) return false;
        const uint64_t next = front ? cur + (uint64_t(1) << 16) : cur - 1;
        if (range.compare_exchange_weak(cur, next, std::memory_order_acquire, std::memory_order_acquire)) {
            *j = front ? f : b - 1;
            return true;
        }
    }
}

uint32_t Team::drain(uint32_t self, uint32_t epoch, uint32_t shares, std::atomic<uint64_t> *done) {
    uint32_t finished = 0, j = 0;
    auto ran = [&] {
        ++finished;
        // Published per sub-chunk: the caller's wait sums these (the loop's fields stay put
        // until every sub-chunk taken is counted).
        if (done) done->store((uint64_t(epoch) << 32) | finished, std::memory_order_release);
    };
    while (take(self, epoch, true, &j)) run_sub(self, j), ran();
    // Own share done: take the others' last sub-chunks, one share after another.
    for (uint32_t n = 1; n < shares; ++n) {
        const uint32_t k = (self + n) % shares;
        while (take(k, epoch, false, &j)) run_sub(k, j), ran();
    }
    return finished;
}

void Team::worker_main(int index) {
    tl_in_chunk = true;  // a worker only ever runs shares: loops inside them run inline
    const uint32_t k = uint32_t(index) + 1;  // share 0 is the caller's
    uint64_t seen = loop_.load(std::memory_order_acquire);
    for (;;) {
        // Poll for the next loop, then sleep until one is handed out.
        auto start = std::chrono::steady_clock::now();
        for (uint32_t polls = 1;; ++polls) {
            if (stop_.load(std::memory_order_relaxed)) return;
            if (loop_.load(std::memory_order_acquire) != seen) break;
            cpu_relax();
            if (polls % 256 != 0) continue;
            // Now and then let another thread of this core run: on an oversubscribed machine
            // it may be the caller, whose loop this worker waits for.
            std::this_thread::yield();
            if (std::chrono::steady_clock::now() - start > kSpin) {
                std::unique_lock<std::mutex> lock(mu_);
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                wake_.wait(lock, [&] {
                    return stop_.load(std::memory_order_seq_cst) || loop_.load(std::memory_order_seq_cst) != seen;
                });
                sleepers_.fetch_sub(1, std::memory_order_relaxed);
                start = std::chrono::steady_clock::now();
            }
        }
        seen = loop_.load(std::memory_order_acquire);
        if (k < shares_of(seen)) drain(k, epoch_of(seen), shares_of(seen), &done_[k].word);
    }
}

void Team::run(uint32_t begin, uint32_t end, uint32_t grain, FunctionRef<void(uint32_t, uint32_t)> body) {
    if (begin >= end) return;
    const uint32_t len = end - begin;
    // One share per thread, each a whole number of sub-chunks of at least the grain (so only
    // the loop's last range is shorter).
    const uint32_t g = grain ? grain : 1;
    const uint32_t even = std::max<uint32_t>(g, (len + uint32_t(size()) - 1) / uint32_t(size()));
    const uint32_t sub_len = std::max<uint32_t>(g, (even + kSubChunks - 1) / kSubChunks);
    const uint32_t share_len = (even + sub_len - 1) / sub_len * sub_len;
    const uint32_t shares = (len + share_len - 1) / share_len;
    if (shares == 1) {
        const bool outer = tl_in_chunk;
        tl_in_chunk = true;
        struct Restore { bool v; ~Restore() { tl_in_chunk = v; } } restore{outer};
        body(begin, end);
        return;
    }
    body_.store(&body, std::memory_order_relaxed);
    begin_.store(begin, std::memory_order_relaxed), end_.store(end, std::memory_order_relaxed);
    share_len_.store(share_len, std::memory_order_relaxed), sub_len_.store(sub_len, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    const uint32_t epoch = epoch_of(loop_.load(std::memory_order_relaxed)) + 1;
    uint32_t total = 0;  // sub-chunks in the loop
    for (uint32_t k = 0; k < shares; ++k) {
        const uint32_t b = begin + k * share_len, e = std::min(end, b + share_len);
        const uint32_t subs = (e - b + sub_len - 1) / sub_len;  // <= kSubChunks
        share_[k].range.store((uint64_t(epoch) << 32) | subs, std::memory_order_relaxed);
        total += subs;
    }
    loop_.store((uint64_t(epoch) << 32) | shares, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        { std::lock_guard<std::mutex> lock(mu_); }
        wake_.notify_all();
    }
    // The caller works like a worker (its share from the front, then the others' from the back),
    // then waits until every sub-chunk a worker took is counted done.
    const uint32_t mine = drain(0, epoch, shares, nullptr);
    for (uint32_t polls = 1;; ++polls) {
        uint32_t finished = mine;
        for (uint32_t k = 1; k < shares; ++k) {
            const uint64_t d = done_[k].word.load(std::memory_order_acquire);
            if (epoch_of(d) == epoch) finished += uint32_t(d);
        }
        if (finished == total) break;
        cpu_relax();
        if (polls % 4096 == 0) std::this_thread::yield();  // a worker may be preempted
    }
    if (failed_.load(std::memory_order_relaxed)) std::rethrow_exception(error_);
}

}  // namespace needle
#endif  // NEEDLE_WITH_TBB
