#include "common/log_rate_limiter.h"

#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

TEST(LogRateLimiterTest, OneLinePerReasonPerIntervalCountingWhatWasHeldBack) {
  FakeClock clock;
  LogRateLimiter limiter(absl::Seconds(10), clock);
  int64_t held = -1;
  ASSERT_TRUE(limiter.Allow("unavailable", &held));
  EXPECT_EQ(held, 0);
  for (int i = 0; i < 721; ++i) {
    int64_t untouched = -7;
    EXPECT_FALSE(limiter.Allow("unavailable", &untouched));
    EXPECT_EQ(untouched, -7);
    clock.Advance(absl::Milliseconds(13));  // 721 calls in 9.373 s
  }
  // Another reason has its own budget.
  ASSERT_TRUE(limiter.Allow("failed_precondition", &held));
  EXPECT_EQ(held, 0);
  clock.Advance(absl::Milliseconds(627));  // exactly 10 s after the first line
  ASSERT_TRUE(limiter.Allow("unavailable", &held));
  EXPECT_EQ(held, 721);
  EXPECT_FALSE(limiter.Allow("unavailable", &held));
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(limiter.Allow("unavailable", &held));
  EXPECT_EQ(held, 1);
}

TEST(LogRateLimiterTest, HeldBackSaysHowManyOrNothing) {
  EXPECT_EQ(HeldBack(0), "");
  EXPECT_EQ(HeldBack(721), " (721 more like it held back)");
}

TEST(LogRateLimiterTest, FailureReasonIsTheStatusCodeInLowerCase) {
  EXPECT_EQ(FailureReason(absl::UnavailableError("down")), "unavailable");
  EXPECT_EQ(FailureReason(absl::FailedPreconditionError("no parent")), "failed_precondition");
  EXPECT_EQ(FailureReason(absl::OkStatus()), "ok");
}

}  // namespace
}  // namespace hybridserve::common
