#include "prefill/service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "prefill/wire.h"

namespace hybridserve::prefill {

void PrefillService::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

int64_t PrefillService::outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  const absl::Time arrival = absl::Now();
  absl::StatusOr<PrefillRequest> parsed = PrefillRequestFromProto(*request);
  if (!parsed.ok()) {
    if (metrics_ != nullptr) metrics_->RecordRefused();
    return common::ToGrpcStatus(parsed.status());
  }
  const PrefillRequest& r = *parsed;
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
  }
  absl::StatusOr<PrefillOutcome> outcome;
  {
    absl::MutexLock engine(&engine_mu_);
    if (context->IsCancelled()) {
      outcome = absl::CancelledError("the caller cancelled before prefill started");
    } else {
      outcome = worker_.Prefill(r);
    }
    if (metrics_ != nullptr) {
      metrics_->SyncCounters(worker_.counters());
      if (outcome.ok()) {
        metrics_->RecordSuccess(*outcome, absl::ToDoubleSeconds(absl::Now() - arrival));
      } else {
        metrics_->RecordFailure();
      }
    }
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
