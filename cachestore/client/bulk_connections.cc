#include "cachestore/client/bulk_connections.h"

#include <utility>

namespace hybridserve::cachestore {

absl::StatusOr<common::Socket> BulkConnections::Take(bool* reused) {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      common::Socket socket = std::move(idle_.back());
      idle_.pop_back();
      *reused = true;
      return socket;
    }
  }
  *reused = false;
  return common::Connect(address_, absl::Now() + timeout_);
}

void BulkConnections::Keep(common::Socket socket) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < kBulkMaxIdleConnections) idle_.push_back(std::move(socket));
}

int64_t BulkConnections::idle() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(idle_.size());
}

}  // namespace hybridserve::cachestore
