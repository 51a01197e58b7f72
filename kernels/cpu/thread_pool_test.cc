#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cpu {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceInContiguousChunks) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> calls{0};
      pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
        ASSERT_LT(begin, end);
        calls.fetch_add(1);
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
      EXPECT_EQ(calls.load(),
                threads == 1 || n == 1 ? 1 : std::min<int64_t>(n, threads * ThreadPool::kChunksPerThread));
    }
  }
}

TEST(ThreadPoolTest, SplitDependsOnlyOnCountAndThreads) {
  // 3 threads: 12 chunks of 30, chunk i = [i * 30 / 12, (i + 1) * 30 / 12).
  ThreadPool pool(3);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelFor(30, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  std::sort(chunks.begin(), chunks.end());
  ASSERT_EQ(chunks.size(), 12u);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(chunks[i], std::make_pair(i * 30 / 12, (i + 1) * 30 / 12)) << i;
  }
}

// A worker the OS does not run (here: one held inside a chunk) does not hold
// up the others: the caller takes every chunk left.
TEST(ThreadPoolTest, ChunksOfAStalledThreadAreTakenByTheOthers) {
  ThreadPool pool(2);
  std::atomic<bool> release{false};
  std::atomic<int> stalled_chunks{0};
  std::atomic<int64_t> done{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::thread releaser;
  pool.ParallelFor(8, [&](int64_t begin, int64_t end) {
    if (std::this_thread::get_id() != caller && stalled_chunks.fetch_add(1) == 0) {
      // The worker's first chunk stalls until the caller has done the rest.
      while (!release.load()) std::this_thread::yield();
    }
    done.fetch_add(end - begin);
    if (std::this_thread::get_id() == caller && done.load() >= 7) release.store(true);
  });
  EXPECT_EQ(done.load(), 8);
  EXPECT_LE(stalled_chunks.load(), 1) << "the stalled worker ran only the chunk it held";
}

// Calls of different sizes, some after the worker has gone to sleep: a worker
// that wakes while the caller prepares the next call must never take a chunk
// past the count of the call it saw (it once did, ran the next call's job and
// left the caller waiting forever: this test hung).
TEST(ThreadPoolTest, CallsOfChangingSizeAfterIdleGapsRunEachChunkOnce) {
  std::mt19937 rng(1);
  for (int p = 0; p < 200; ++p) {
    ThreadPool pool(2);
    for (int i = 0; i < 20; ++i) {
      const int64_t n = 1 + rng() % 20;
      if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      std::atomic<int64_t> covered{0};
      std::atomic<int> calls{0};
      pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
        covered.fetch_add(end - begin);
        calls.fetch_add(1);
      });
      ASSERT_EQ(covered.load(), n);
      ASSERT_EQ(calls.load(), n == 1 ? 1 : std::min<int64_t>(n, 2 * ThreadPool::kChunksPerThread));
    }
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.ParallelFor(10, [&](int64_t b, int64_t e) {
        EXPECT_EQ(b, 0);  // inline: one range
        EXPECT_EQ(e, 10);
        sum.fetch_add(e - b);
      });
    }
  });
  EXPECT_EQ(sum.load(), 40);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerializedAndComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int r = 0; r < 200; ++r) {
      pool.ParallelFor(16, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 16);
}

TEST(ThreadPoolTest, NullPoolRunsWholeRangeOnCaller) {
  int64_t got_begin = -1, got_end = -1;
  ParallelFor(nullptr, 9, [&](int64_t begin, int64_t end) {
    got_begin = begin;
    got_end = end;
  });
  EXPECT_EQ(got_begin, 0);
  EXPECT_EQ(got_end, 9);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
