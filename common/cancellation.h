#ifndef HYBRIDSERVE_COMMON_CANCELLATION_H_
#define HYBRIDSERVE_COMMON_CANCELLATION_H_

// A one-shot cancellation signal shared by whoever started a piece of work
// and whoever runs it: decode cancels a request's prefill call when the
// request ends first (cancel, Abort, deadline); the gRPC prefill client turns
// it into ClientContext::TryCancel, the prefill worker polls it between
// segments. A source that cannot call back (gRPC's synchronous server has
// only ServerContext::IsCancelled) is given as a poll: cancelled() asks it
// too. Thread-safe.

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hybridserve::common {

class Cancellation {
 public:
  Cancellation() = default;
  // Also cancelled whenever `poll` (thread-safe, cheap) returns true; WaitFor
  // and OnCancel callbacks see only Cancel.
  explicit Cancellation(std::function<bool()> poll) : poll_(std::move(poll)) {}

  // Cancels: runs the registered callback (once).
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Registers `on_cancel` (cheap, non-blocking: e.g. ClientContext::TryCancel)
  // to run at Cancel, or now when cancelled already; nullptr unregisters.
  // When OnCancel(nullptr) returns, the previous callback is not running and
  // never will.
  void OnCancel(std::function<void()> on_cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for Cancel; true when cancelled.
  bool WaitFor(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  const std::function<bool()> poll_;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_CANCELLATION_H_
