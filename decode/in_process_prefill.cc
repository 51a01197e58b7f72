#include "decode/in_process_prefill.h"

#include <utility>

#include "absl/time/clock.h"

namespace hybridserve::decode {

PrefillReply ReplyFromOutcome(prefill::PrefillOutcome outcome) {
  PrefillReply reply;
  reply.first = std::move(outcome.first);
  reply.cached_tokens = outcome.usage.cached_tokens;
  reply.recomputed_tokens = outcome.usage.recomputed_tokens;
  reply.prefill_publishes_prompt = outcome.publishes_prompt;
  switch (outcome.usage.resume_kind) {
    case prefill::ResumeKind::kCold:
      reply.resume_kind = ResumeKind::kCold;
      break;
    case prefill::ResumeKind::kGridCheckpoint:
      reply.resume_kind = ResumeKind::kGridCheckpoint;
      break;
    case prefill::ResumeKind::kExactPrefix:
      reply.resume_kind = ResumeKind::kExactPrefix;
      break;
  }
  return reply;
}

absl::StatusOr<PrefillReply> InProcessPrefillClient::Prefill(const PrefillCall& call) {
  prefill::PrefillRequest r;
  r.request_id = call.request_id;
  r.prompt = call.prompt;
  r.cache_salt = call.cache_salt;
  r.sampling = call.sampling;
  r.ticket = call.ticket;
  if (call.cancellation != nullptr) {
    r.cancelled = [c = call.cancellation] { return c->cancelled(); };
  }
  absl::MutexLock lock(&mu_);
  if (call.cancellation != nullptr && call.cancellation->cancelled()) {
    return absl::CancelledError("the request ended before its prefill");
  }
  if (absl::Now() >= call.deadline) return absl::DeadlineExceededError("the request's deadline passed before prefill");
  absl::StatusOr<prefill::PrefillOutcome> outcome = worker_.Prefill(r);
  if (!outcome.ok()) return outcome.status();
  return ReplyFromOutcome(*std::move(outcome));
}

}  // namespace hybridserve::decode
