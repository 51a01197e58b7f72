#ifndef HYBRIDSERVE_COMMON_CLOCK_H_
#define HYBRIDSERVE_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hybridserve::common {

// A source of the current time, injected wherever behaviour depends on time
// (TTLs, leases, deadlines) so tests can drive it with FakeClock. Implementations
// are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock; never null, never destroyed.
  static Clock& Real();
};

// Thread-safe. Time stands still until a test advances it.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000)) : now_(start) {}

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_CLOCK_H_
