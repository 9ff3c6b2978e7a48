// The thread team behind a state's parallel loops (src/core/team.h): every index of a loop runs
// exactly once, in ranges of at least the grain, with the body's writes visible to the caller
// after run() returns; nested loops run inline; exceptions reach the caller; teams leased from
// many host threads at once do not mix. scripts/sanitize.sh runs these under ThreadSanitizer
// (the team is our code, so TSan sees all of its synchronisation).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"

#if NEEDLE_WITH_TBB
#include "core/team.h"

using needle::Team;

namespace {

// Runs [begin, end) with grain on team and checks: every index once, each range >= grain unless
// it ends the loop, and the plain (non-atomic) writes of the ranges are all seen here.
void check_loop(Team &team, uint32_t begin, uint32_t end, uint32_t grain) {
    CAPTURE(team.size());
    CAPTURE(begin);
    CAPTURE(end);
    CAPTURE(grain);
    std::vector<uint32_t> out(end, 0);
    std::vector<std::atomic<int>> runs(end);
    std::atomic<int> short_ranges{0}, out_of_range{0};
    team.run(begin, end, grain, [&](uint32_t b, uint32_t e) {
        if (b < begin || e > end || b >= e) {
            out_of_range.fetch_add(1);
            return;
        }
        if (e - b < (grain ? grain : 1) && e != end) short_ranges.fetch_add(1);
        for (uint32_t i = b; i < e; ++i) {
            runs[i].fetch_add(1, std::memory_order_relaxed);
            out[i] = i * 7u + 1u;
        }
    });
    CHECK(out_of_range.load() == 0);
    CHECK(short_ranges.load() == 0);
    uint32_t wrong = 0;
    for (uint32_t i = 0; i < end; ++i) {
        const bool in = i >= begin;
        wrong += runs[i].load() != (in ? 1 : 0);
        wrong += out[i] != (in ? i * 7u + 1u : 0u);
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("team: every index of a loop runs once, in ranges of at least the grain, for 1 to 4 threads") {
    for (int n = 1; n <= 4; ++n) {
        Team team(n);
        CHECK(team.size() == n);
        for (uint32_t len : {1u, 2u, 3u, 5u, 8u, 17u, 64u, 1000u})
            for (uint32_t grain : {0u, 1u, 2u, 3u, 7u, 64u, 5000u}) check_loop(team, 3, 3 + len, grain);
        check_loop(team, 0, 0, 1);  // empty: the body is not called
    }
}

TEST_CASE("team: loops inside a range run inline on its thread") {
    Team team(2);
    std::atomic<int> bad{0}, nested_calls{0};
    for (int rep = 0; rep < 200; ++rep) {
        team.run(0, 2, 1, [&](uint32_t, uint32_t) {
            if (!Team::in_chunk()) bad.fetch_add(1);
            const auto me = std::this_thread::get_id();
            needle::parallel_for(0, 8, 1, [&](uint32_t b, uint32_t e) {
                nested_calls.fetch_add(1);
                if (std::this_thread::get_id() != me || b != 0 || e != 8) bad.fetch_add(1);
            });
        });
    }
    CHECK(bad.load() == 0);
    CHECK(nested_calls.load() == 400);  // one inline call per range, two ranges per loop
    CHECK_FALSE(Team::in_chunk());
}

TEST_CASE("team: an exception in a range reaches the caller, ranges not started are skipped, the team goes on") {
    Team team(3);
    for (uint32_t thrower = 0; thrower < 3; ++thrower) {
        CAPTURE(thrower);
        std::vector<std::atomic<int>> ran(3);
        bool caught = false;
        try {
            team.run(0, 3, 1, [&](uint32_t b, uint32_t e) {
                for (uint32_t i = b; i < e; ++i) {
                    ran[i].fetch_add(1);
                    if (i == thrower) throw std::runtime_error("range " + std::to_string(i));
                }
            });
        } catch (const std::runtime_error &e) {
            caught = std::string(e.what()) == "range " + std::to_string(thrower);
        }
        CHECK(caught);
        for (uint32_t i = 0; i < 3; ++i) CHECK(ran[i].load() <= 1);
        CHECK(ran[thrower].load() == 1);
        check_loop(team, 0, 100, 1);
    }
}

TEST_CASE("team: loops handed out while workers poll, sleep or wake: every index once") {
    // Gaps of 0 to ~600 µs between loops cross the workers' polling time (then they sleep), so
    // the caller sometimes runs a share its worker has not claimed yet.
    Team team(2);
    uint32_t seed = 12345;
    for (int rep = 0; rep < 400; ++rep) {
        seed = seed * 1664525u + 1013904223u;
        const uint32_t len = 1 + (seed >> 8) % 40;
        if (rep % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds((seed >> 4) % 600));
        check_loop(team, 0, len, 1);
    }
}

TEST_CASE("team: the caller runs the sub-chunks a slow worker has not taken yet") {
    Team team(2);
    const auto caller = std::this_thread::get_id();
    for (int rep = 0; rep < 5; ++rep) {
        std::vector<std::atomic<int>> runs(16);
        std::atomic<int> by_caller_in_worker_share{0};
        team.run(0, 16, 1, [&](uint32_t b, uint32_t e) {
            const bool on_caller = std::this_thread::get_id() == caller;
            // The worker's first sub-chunk takes 5 ms: meanwhile the caller, done with [0, 8),
            // should take the rest of [8, 16) from the back.
            if (!on_caller) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            for (uint32_t i = b; i < e; ++i) {
                runs[i].fetch_add(1);
                if (on_caller && i >= 8) by_caller_in_worker_share.fetch_add(1);
            }
        });
        for (uint32_t i = 0; i < 16; ++i) CHECK(runs[i].load() == 1);
        // All but the sub-chunk the worker took (7), unless the caller itself lost its core for
        // several of the worker's 5 ms sub-chunks.
        CHECK(by_caller_in_worker_share.load() >= 4);
    }
}

TEST_CASE("team: host threads leasing teams at once each get their own") {
    constexpr int kHosts = 4;
    std::vector<std::thread> hosts;
    std::vector<int> bad(kHosts, 0);
    for (int h = 0; h < kHosts; ++h)
        hosts.emplace_back([h, &bad] {
            for (int round = 0; round < 20; ++round) {
                const Team::Lease lease(2);  // what ArenaLease::execute holds for a forward pass
                if (!Team::current()) continue;  // NEEDLE_TEAM=0: loops go to oneTBB
                std::vector<uint32_t> out(257, 0);
                for (int rep = 0; rep < 20; ++rep)
                    needle::parallel_for(0, 257, 1, [&](uint32_t b, uint32_t e) {
                        for (uint32_t i = b; i < e; ++i) out[i] += i + uint32_t(h);
                    });
                for (uint32_t i = 0; i < 257; ++i) bad[size_t(h)] += out[i] != 20u * (i + uint32_t(h));
            }
            if (Team::current()) bad[size_t(h)] += 1000;  // the lease ended: no team is current
        });
    for (std::thread &t : hosts) t.join();
    for (int h = 0; h < kHosts; ++h) CHECK(bad[size_t(h)] == 0);
}

TEST_CASE("team: a lease for one thread, or nested in another, restores what was current") {
    CHECK(Team::current() == nullptr);
    {
        const Team::Lease one(1);
        CHECK(Team::current() == nullptr);  // one thread: loops run on the caller
    }
    {
        const Team::Lease outer(2);
        Team *const t = Team::current();
        {
            const Team::Lease inner(2);
            if (t) CHECK(Team::current() != t);
        }
        CHECK(Team::current() == t);
    }
    CHECK(Team::current() == nullptr);
}
#endif
