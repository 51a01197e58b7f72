#include "prefill/service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/grpc_status.h"
#include "prefill/prefill_proto.h"

namespace hybridserve::prefill {

void PrefillService::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

int64_t PrefillService::outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

bool PrefillService::AwaitEngine(uint64_t ticket, grpc::ServerContext* context) {
  absl::MutexLock lock(&mu_);
  auto my_turn = [this, ticket]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !engine_busy_ && queue_.front() == ticket; };
  // The synchronous API has no cancellation callback: look every 10 ms.
  while (!mu_.AwaitWithTimeout(absl::Condition(&my_turn), absl::Milliseconds(10))) {
    if (context->IsCancelled()) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
      return false;
    }
  }
  queue_.pop_front();
  engine_busy_ = true;
  return true;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  const absl::Time arrival = absl::Now();
  absl::StatusOr<PrefillRequest> parsed = RequestFromProto(*request);
  if (!parsed.ok()) {
    if (metrics_ != nullptr) metrics_->RecordRefused();
    return common::ToGrpcStatus(parsed.status());
  }
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    const bool full = outstanding_ >= max_queue_ + 1;
    if ((draining_ || full) && metrics_ != nullptr) metrics_->RecordRefused();
    if (draining_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the prefill worker is draining");
    if (full) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("the prefill worker is full: ", outstanding_, " requests outstanding"));
    }
    ++outstanding_;
    if (metrics_ != nullptr) metrics_->SetQueueDepth(outstanding_);
    ticket = next_ticket_++;
    queue_.push_back(ticket);
  }
  absl::StatusOr<PrefillOutcome> outcome;
  if (!AwaitEngine(ticket, context)) {
    outcome = absl::CancelledError("the caller cancelled before prefill started");
    if (metrics_ != nullptr) metrics_->RecordCancelled();
  } else {
    parsed->cancellation = std::make_shared<common::Cancellation>([context] { return context->IsCancelled(); });
    outcome = worker_.Prefill(*parsed);
    if (metrics_ != nullptr) {
      metrics_->SyncCounters(worker_.counters());
      metrics_->SetFree(worker_.free_pages(), worker_.free_slots());
      if (outcome.ok()) {
        metrics_->RecordSuccess(*outcome, absl::ToDoubleSeconds(absl::Now() - arrival));
      } else if (outcome.status().code() == absl::StatusCode::kCancelled) {
        metrics_->RecordCancelled();
      } else {
        metrics_->RecordFailure();
      }
    }
    absl::MutexLock lock(&mu_);
    engine_busy_ = false;
  }
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (metrics_ != nullptr) metrics_->SetQueueDepth(outstanding_);
  }
  if (!outcome.ok()) return common::ToGrpcStatus(outcome.status());
  OutcomeToProto(*outcome, response);
  return grpc::Status::OK;
}

}  // namespace hybridserve::prefill
