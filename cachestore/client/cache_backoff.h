#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_BACKOFF_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_BACKOFF_H_

// A worker's one memory of a hung cache. A cache call that timed out
// (DEADLINE_EXCEEDED: a cachestore that hangs, not one that is down, which
// refuses at once and costs nothing) starts a skip of `backoff`: meanwhile
// whoever asks Skipping() (the publisher's puts, decode's history reads and
// local prefill's probe, prefill's lookups) leaves the cache alone, so a hung
// cache costs the worker one timeout per backoff, not one per request. The
// first call after the skip reaches the cache again: a cache that recovered
// is used at once, one still hung starts the next skip.
//
// Thread-safe.

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace hybridserve::cachestore {

class CacheBackoff {
 public:
  // `backoff` <= 0: never skips. `clock` must outlive this.
  explicit CacheBackoff(absl::Duration backoff, const common::Clock& clock = common::Clock::Real())
      : backoff_(backoff), clock_(clock) {}

  // True while a skip runs.
  bool Skipping() const ABSL_LOCKS_EXCLUDED(mu_);
  // Notes a cache call's status: DEADLINE_EXCEEDED starts (or restarts) the
  // skip. True when it did.
  bool Note(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration backoff() const { return backoff_; }

 private:
  const absl::Duration backoff_;
  const common::Clock& clock_;
  mutable absl::Mutex mu_;
  absl::Time skip_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_BACKOFF_H_
