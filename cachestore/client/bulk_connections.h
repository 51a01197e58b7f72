#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_BULK_CONNECTIONS_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_BULK_CONNECTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

// Connections a client keeps between calls: enough for the calls one worker
// runs at once.
inline constexpr size_t kBulkMaxIdleConnections = 4;

// Connections to a cachestore's bulk port, kept between calls (at most
// kBulkMaxIdleConnections idle) after a call that ended cleanly: a call pays
// no connect, and a busy worker leaves no trail of closed sockets in
// TIME_WAIT. A kept connection may have been closed by the server meanwhile
// (idle past its --bulk_io_timeout, or restarted): Take says whether it
// handed out a kept one, and a call that fails on one before any answer
// goes again on a new one. Thread-safe.
class BulkConnections {
 public:
  BulkConnections(std::string address, absl::Duration timeout) : address_(std::move(address)), timeout_(timeout) {}

  // A kept connection (*reused) or a new one (connected within the timeout).
  absl::StatusOr<common::Socket> Take(bool* reused) ABSL_LOCKS_EXCLUDED(mu_);
  void Keep(common::Socket socket) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t idle() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string address_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<common::Socket> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_BULK_CONNECTIONS_H_
