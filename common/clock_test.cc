#include "common/clock.h"

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

TEST(FakeClockTest, StandsStillUntilAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(105));
}

TEST(RealClockTest, IsMonotonicEnoughForTwoReads) {
  absl::Time a = Clock::Real().Now();
  absl::Time b = Clock::Real().Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace hybridserve::common
