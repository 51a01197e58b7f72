#include "common/cancellation.h"

#include <atomic>

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

TEST(CancellationTest, RunsItsCallbackOnceAndWakesWaiters) {
  Cancellation c;
  int runs = 0;
  c.OnCancel([&] { ++runs; });
  EXPECT_FALSE(c.cancelled());
  EXPECT_FALSE(c.WaitFor(absl::Milliseconds(1)));
  c.Cancel();
  c.Cancel();
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(c.cancelled());
  EXPECT_TRUE(c.WaitFor(absl::Seconds(10)));
  // Registered after the cancel: runs at once.
  c.OnCancel([&] { ++runs; });
  EXPECT_EQ(runs, 2);
  c.OnCancel(nullptr);
}

TEST(CancellationTest, AsksItsPollToo) {
  std::atomic<bool> source{false};
  Cancellation c([&] { return source.load(); });
  EXPECT_FALSE(c.cancelled());
  source = true;
  EXPECT_TRUE(c.cancelled());
  // The poll is not a Cancel: callbacks and waiters see Cancel only.
  int runs = 0;
  c.OnCancel([&] { ++runs; });
  EXPECT_EQ(runs, 0);
  c.Cancel();
  EXPECT_EQ(runs, 1);
  c.OnCancel(nullptr);
}

}  // namespace
}  // namespace hybridserve::common
