#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cpu {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceInContiguousRanges) {
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
      EXPECT_EQ(calls.load(), std::min<int64_t>(n, threads));
    }
  }
}

TEST(ThreadPoolTest, SplitDependsOnlyOnCountAndThreads) {
  ThreadPool pool(3);
  std::vector<std::pair<int64_t, int64_t>> ranges(3, {-1, -1});
  pool.ParallelFor(10, [&](int64_t begin, int64_t end) {
    const int64_t index = begin == 0 ? 0 : (begin == 3 ? 1 : 2);
    ranges[index] = {begin, end};
  });
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(ranges[1], std::make_pair(int64_t{3}, int64_t{6}));
  EXPECT_EQ(ranges[2], std::make_pair(int64_t{6}, int64_t{10}));
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
