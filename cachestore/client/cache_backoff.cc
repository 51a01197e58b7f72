#include "cachestore/client/cache_backoff.h"

namespace hybridserve::cachestore {

bool CacheBackoff::Skipping() const {
  absl::MutexLock lock(&mu_);
  return clock_.Now() < skip_until_;
}

bool CacheBackoff::Note(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kDeadlineExceeded || backoff_ <= absl::ZeroDuration()) return false;
  absl::MutexLock lock(&mu_);
  skip_until_ = clock_.Now() + backoff_;
  return true;
}

}  // namespace hybridserve::cachestore
