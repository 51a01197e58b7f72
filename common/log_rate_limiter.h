#ifndef HYBRIDSERVE_COMMON_LOG_RATE_LIMITER_H_
#define HYBRIDSERVE_COMMON_LOG_RATE_LIMITER_H_

// Rate limits a warning per reason: at most one line per reason per
// `interval`, and the line that is let through says how many like it were
// held back since the last one, so a storm (a cachestore down for ten seconds
// under load) costs a handful of lines and still shows its size.
//
//   int64_t held_back = 0;
//   if (limiter.Allow("cache_unavailable", &held_back)) {
//     LOG(WARNING) << "... " << common::HeldBack(held_back);
//   }
//
// Thread-safe.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace hybridserve::common {

class LogRateLimiter {
 public:
  // `clock` must outlive the limiter.
  explicit LogRateLimiter(absl::Duration interval = absl::Seconds(10), const Clock& clock = Clock::Real())
      : interval_(interval), clock_(clock) {}

  // True when a line for `reason` may be written now; then `*held_back` is
  // the number of calls for `reason` refused since the last one allowed.
  bool Allow(absl::string_view reason, int64_t* held_back) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Reason {
    absl::Time last = absl::InfinitePast();
    int64_t held_back = 0;
  };
  const absl::Duration interval_;
  const Clock& clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Reason> reasons_ ABSL_GUARDED_BY(mu_);
};

// " (N more like it held back)" for N > 0, else "".
std::string HeldBack(int64_t n);

// The label a failure is counted and logged under: its status code in lower
// case ("unavailable", "failed_precondition", ...).
std::string FailureReason(const absl::Status& status);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_LOG_RATE_LIMITER_H_
