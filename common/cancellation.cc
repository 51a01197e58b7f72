#include "common/cancellation.h"

#include <utility>

namespace hybridserve::common {

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (on_cancel_) on_cancel_();
}

bool Cancellation::cancelled() const {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return true;
  }
  return poll_ && poll_();
}

void Cancellation::OnCancel(std::function<void()> on_cancel) {
  absl::MutexLock lock(&mu_);
  on_cancel_ = std::move(on_cancel);
  if (cancelled_ && on_cancel_) on_cancel_();
}

bool Cancellation::WaitFor(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
}

}  // namespace hybridserve::common
