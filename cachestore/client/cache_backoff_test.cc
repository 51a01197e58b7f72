#include "cachestore/client/cache_backoff.h"

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

TEST(CacheBackoffTest, ATimeoutSkipsForTheBackoffThenTheCacheIsTriedAgain) {
  common::FakeClock clock;
  CacheBackoff backoff(absl::Milliseconds(200), clock);
  EXPECT_FALSE(backoff.Skipping());
  EXPECT_TRUE(backoff.Note(absl::DeadlineExceededError("hung")));
  EXPECT_TRUE(backoff.Skipping());
  clock.Advance(absl::Milliseconds(199));
  EXPECT_TRUE(backoff.Skipping());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(backoff.Skipping()) << "the skip ends after the backoff: the next call reaches the cache";
}

TEST(CacheBackoffTest, ATimeoutDuringTheSkipRestartsIt) {
  common::FakeClock clock;
  CacheBackoff backoff(absl::Milliseconds(200), clock);
  ASSERT_TRUE(backoff.Note(absl::DeadlineExceededError("hung")));
  clock.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(backoff.Note(absl::DeadlineExceededError("hung again")));
  clock.Advance(absl::Milliseconds(150));
  EXPECT_TRUE(backoff.Skipping());
  clock.Advance(absl::Milliseconds(50));
  EXPECT_FALSE(backoff.Skipping());
}

TEST(CacheBackoffTest, OnlyATimeoutStartsASkip) {
  common::FakeClock clock;
  CacheBackoff backoff(absl::Seconds(1), clock);
  // A cachestore that is down refuses at once: its return is seen at once.
  for (const absl::Status& s : {absl::OkStatus(), absl::UnavailableError("down"), absl::CancelledError("cancelled"),
                                absl::InternalError("bad"), absl::NotFoundError("miss")}) {
    EXPECT_FALSE(backoff.Note(s)) << s;
    EXPECT_FALSE(backoff.Skipping()) << s;
  }
}

TEST(CacheBackoffTest, AZeroBackoffNeverSkips) {
  common::FakeClock clock;
  CacheBackoff backoff(absl::ZeroDuration(), clock);
  EXPECT_FALSE(backoff.Note(absl::DeadlineExceededError("hung")));
  EXPECT_FALSE(backoff.Skipping());
}

}  // namespace
}  // namespace hybridserve::cachestore
