#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvx {
namespace {

TEST(ThreadPoolTest, EqualRangesEachRunOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {1u, 2u, 5u, 7u, 100u}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::pair<size_t, size_t>> ranges;
      std::mutex mu;
      pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
        ASSERT_GE(t, 0);
        ASSERT_LT(t, threads);
        for (size_t i = b; i < e; ++i) hits[i]++;
        std::lock_guard<std::mutex> lock(mu);
        ranges.emplace_back(b, e);
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1);
      const size_t parts = std::min<size_t>(n, threads);
      ASSERT_EQ(ranges.size(), parts);
      for (const auto& [b, e] : ranges) EXPECT_TRUE(e - b == n / parts || e - b == n / parts + 1);
    }
  }
}

TEST(ThreadPoolTest, DynamicCoversEveryIndexOnceWithGrain) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {1u, 3u, 64u, 1000u}) {
      for (size_t grain : {0u, 1u, 7u, 64u, 5000u}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> calls{0};
        pool.ParallelForDynamic(n, grain, [&](size_t b, size_t e, int t) {
          ASSERT_LT(b, e);
          ASSERT_LE(e, n);
          ASSERT_LT(t, threads);
          const size_t g = grain == 0 ? 1 : grain;
          EXPECT_EQ(b % g, 0u);
          EXPECT_TRUE(e - b == g || e == n);
          calls++;
          for (size_t i = b; i < e; ++i) hits[i]++;
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain << " " << i;
        const size_t g = grain == 0 ? 1 : grain;
        EXPECT_EQ(static_cast<size_t>(calls.load()), (n + g - 1) / g);
      }
    }
  }
}

TEST(ThreadPoolTest, ManyTinyJobsMixedKinds) {
  // Hammers the dispatch protocol: thousands of back-to-back jobs of both
  // kinds, with workers sometimes spinning and sometimes late.
  ThreadPool pool(3);
  std::vector<int64_t> out(97);
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t n = 1 + iter % 97;
    auto body = [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) out[i] = iter * 1000 + static_cast<int64_t>(i);
    };
    if (iter % 3 == 0) {
      pool.ParallelFor(n, body);
    } else {
      pool.ParallelForDynamic(n, iter % 5, body);
    }
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], iter * 1000 + static_cast<int64_t>(i));
  }
}

TEST(ThreadPoolTest, OthersTakeOverTheShareOfABlockedThread) {
  // Whichever thread runs index 0 (normally the caller, first in its own
  // share) blocks until every other index has run: the rest of its share
  // must be taken over by the other threads, or this would time out.
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    const size_t n = 40;
    std::atomic<size_t> others{0};
    bool all_ran = false;
    pool.ParallelForDynamic(n, 1, [&](size_t b, size_t, int) {
      if (b != 0) {
        others++;
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (others.load() != n - 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      all_ran = others.load() == n - 1;
    });
    EXPECT_TRUE(all_ran) << threads << " threads: index 0's thread waited alone";
  }
}

TEST(ThreadPoolTest, TakesOverAShareInIncreasingOrder) {
  // The worker's first chunk blocks until every other chunk has run, so the
  // caller takes over the rest of the worker's share: in increasing order,
  // as a matmul's weight stream wants it (or the whole share, if the worker
  // came late). Every thread's chunks are thus in increasing order.
  ThreadPool pool(2);
  const size_t n = 16;
  std::atomic<size_t> finished{0};
  std::vector<size_t> caller_order;
  pool.ParallelForDynamic(n, 1, [&](size_t b, size_t, int t) {
    if (t == 0) {
      caller_order.push_back(b);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (finished.load() < n - 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    }
    finished++;
  });
  ASSERT_GE(caller_order.size(), n / 2 + 1) << "the caller took over none of the worker's share";
  for (size_t i = 1; i < caller_order.size(); ++i) {
    EXPECT_LT(caller_order[i - 1], caller_order[i]) << "chunk " << caller_order[i] << " after " << caller_order[i - 1];
  }
}

TEST(ThreadPoolTest, WakesSleepingWorkers) {
  // After kSpinMicros idle, workers sleep on a futex; the next job must wake
  // them: with 30 ranges of 1 ms, the workers join in well before the end.
  ThreadPool pool(3);
  for (int round = 0; round < 2; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(3 * ThreadPool::kSpinMicros));
    std::atomic<int> mask{0}, sum{0};
    pool.ParallelForDynamic(30, 1, [&](size_t b, size_t, int t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      mask |= 1 << t;
      sum += static_cast<int>(b);
    });
    EXPECT_EQ(sum.load(), 435);
    EXPECT_NE(mask.load() & 6, 0) << "no worker woke up";
  }
}

TEST(ThreadPoolTest, AcceptsStdFunctionAndLongBodies) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  std::function<void(size_t, size_t, int)> f = [&](size_t b, size_t e, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // longer than the spin window
    total += e - b;
  };
  pool.ParallelFor(10, f);
  EXPECT_EQ(total.load(), 10u);
  pool.ParallelForDynamic(10, 3, f);
  EXPECT_EQ(total.load(), 20u);
}

TEST(ThreadPoolTest, LoopStatsSplitEachThreadsTime) {
  // Two ranges, one 20 ms long and one empty: whichever thread runs the
  // short one (or none, if it came late) waits ~20 ms, as imbalance or late.
  // The parts add up to size() x the loop's wall time.
  ThreadPool pool(2);
  ThreadPool::LoopStats stats;
  pool.set_loop_stats(&stats);
  constexpr int64_t kLongNs = 20'000'000;
  pool.ParallelFor(2, [&](size_t b, size_t, int) {
    if (b == 0) std::this_thread::sleep_for(std::chrono::nanoseconds(kLongNs));
  });
  pool.ParallelFor(1, [](size_t, size_t, int) {});  // inline on the caller: not a loop
  pool.set_loop_stats(nullptr);
  pool.ParallelFor(2, [](size_t, size_t, int) {});  // not accounted
  EXPECT_EQ(stats.loops, 1);
  EXPECT_GE(stats.wall_ns, kLongNs);
  EXPECT_GE(stats.busy_ns, kLongNs);
  EXPECT_GE(stats.late_ns + stats.imbalance_ns, kLongNs * 9 / 10);
  for (int64_t part : {stats.busy_ns, stats.late_ns, stats.imbalance_ns, stats.join_ns, stats.claims_ns}) {
    EXPECT_GE(part, 0);
  }
  EXPECT_EQ(stats.busy_ns + stats.late_ns + stats.imbalance_ns + stats.join_ns + stats.claims_ns,
            2 * stats.wall_ns);
}

TEST(ThreadPoolTest, LoopStatsCountBusyTimeOfEveryChunk) {
  // 8 chunks of 2 ms on 2 threads: 16 ms in chunks, whoever runs them.
  ThreadPool pool(2);
  ThreadPool::LoopStats stats;
  pool.set_loop_stats(&stats);
  for (int i = 0; i < 3; ++i) {
    pool.ParallelForDynamic(8, 1, [](size_t, size_t, int) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  }
  pool.set_loop_stats(nullptr);
  EXPECT_EQ(stats.loops, 3);
  EXPECT_GE(stats.busy_ns, 3 * 16'000'000);
  EXPECT_LE(stats.busy_ns, 2 * stats.wall_ns);
}

}  // namespace
}  // namespace kvx
