#include "prefill/in_process_prefill_client.h"

#include "absl/time/clock.h"

namespace hybridserve::prefill {

absl::StatusOr<PrefillOutcome> InProcessPrefillClient::Prefill(const PrefillRequest& request) {
  absl::MutexLock lock(&mu_);
  if (request.cancellation != nullptr && request.cancellation->cancelled()) {
    return absl::CancelledError("the request ended before its prefill");
  }
  if (absl::Now() >= request.ticket.deadline) {
    return absl::DeadlineExceededError("the request's deadline passed before prefill");
  }
  return worker_.Prefill(request);
}

}  // namespace hybridserve::prefill
