#include "common/cancellation.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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

// Several threads cancel at once while others wait: the callback runs once,
// and every waiter wakes (WaitFor's timeout is far beyond the test's).
TEST(CancellationTest, RacingCancelsRunTheCallbackOnceAndWakeEveryWaiter) {
  constexpr int kThreads = 4;
  for (int round = 0; round < 1000; ++round) {
    Cancellation c;
    std::atomic<int> runs{0};
    c.OnCancel([&] { runs.fetch_add(1); });
    std::atomic<int> ready{0};  // the cancellers start together (a spin barrier)
    std::atomic<int> woken{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&] {
        if (c.WaitFor(absl::Seconds(60))) woken.fetch_add(1);
      });
      threads.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        c.Cancel();
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(runs.load(), 1) << "round " << round;
    EXPECT_EQ(woken.load(), kThreads) << "round " << round;
    EXPECT_TRUE(c.cancelled());
  }
}

// Threads register callbacks while another cancels: each callback runs at
// most once, whichever callback is registered at the end ran exactly once
// (by Cancel, or at its registration when the cancel came first), and a
// callback registered afterwards runs at once.
TEST(CancellationTest, CallbacksRegisteredWhileCancellingRunAtMostOnce) {
  constexpr int kRegistrars = 4;
  for (int round = 0; round < 50; ++round) {
    Cancellation c;
    std::vector<std::unique_ptr<std::atomic<int>>> runs;
    for (int i = 0; i < kRegistrars; ++i) runs.push_back(std::make_unique<std::atomic<int>>(0));
    absl::Notification go;
    std::vector<std::thread> threads;
    for (int i = 0; i < kRegistrars; ++i) {
      threads.emplace_back([&, i] {
        go.WaitForNotification();
        c.OnCancel([&, i] { runs[i]->fetch_add(1); });
      });
    }
    threads.emplace_back([&] {
      go.WaitForNotification();
      c.Cancel();
    });
    go.Notify();
    for (std::thread& t : threads) t.join();
    int total = 0;
    for (int i = 0; i < kRegistrars; ++i) {
      EXPECT_LE(runs[i]->load(), 1) << "round " << round << " callback " << i;
      total += runs[i]->load();
    }
    EXPECT_GE(total, 1) << "round " << round << ": the callback registered last never ran";
    std::atomic<int> late{0};
    c.OnCancel([&] { late.fetch_add(1); });
    EXPECT_EQ(late.load(), 1);
    for (int i = 0; i < kRegistrars; ++i) EXPECT_LE(runs[i]->load(), 1);
    c.OnCancel(nullptr);
  }
}

// OnCancel(nullptr) racing Cancel: once it returns, the callback it replaced
// is not running and never runs; before, it ran at most once. (The callback
// lingers a little, so one still running when OnCancel returns is seen.)
TEST(CancellationTest, AnUnregisteredCallbackNeverRunsAfterOnCancelReturns) {
  for (int round = 0; round < 300; ++round) {
    Cancellation c;
    std::atomic<bool> running{false};
    std::atomic<bool> unregistered{false};
    std::atomic<int> runs{0};
    std::atomic<int> violations{0};
    c.OnCancel([&] {
      running = true;
      runs.fetch_add(1);
      for (int i = 0; i < 50; ++i) {
        if (unregistered.load()) violations.fetch_add(1);
        std::this_thread::yield();
      }
      running = false;
    });
    std::atomic<int> ready{0};  // both start together (a spin barrier)
    auto start = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
    };
    std::thread canceller([&] {
      start();
      c.Cancel();
    });
    std::thread unregisterer([&] {
      start();
      c.OnCancel(nullptr);
      if (running.load()) violations.fetch_add(1);
      unregistered = true;
    });
    canceller.join();
    unregisterer.join();
    EXPECT_EQ(violations.load(), 0) << "round " << round << ": the callback ran after OnCancel(nullptr) returned";
    EXPECT_LE(runs.load(), 1) << "round " << round;
    EXPECT_TRUE(c.WaitFor(absl::ZeroDuration()));
  }
}

}  // namespace
}  // namespace hybridserve::common
