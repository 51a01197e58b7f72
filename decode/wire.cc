#include "decode/wire.h"

#include <cstdint>
#include <utility>

#include "prefill/wire.h"

namespace hybridserve::decode {

absl::StatusOr<GenerateRequest> FromProto(const v1::GenerateRequest& p) {
  GenerateRequest r;
  r.request_id = p.request_id();
  r.prompt.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  absl::StatusOr<engine::SamplingParams> sampling = prefill::SamplingFromProto(p);
  if (!sampling.ok()) return sampling.status();
  r.sampling = *sampling;
  r.stop.max_tokens = p.stop().max_tokens();
  r.stop.stop_token_ids.assign(p.stop().stop_token_ids().begin(), p.stop().stop_token_ids().end());
  for (const v1::TokenSequence& seq : p.stop().stop_sequences()) {
    r.stop.stop_sequences.emplace_back(seq.token_ids().begin(), seq.token_ids().end());
  }
  r.stop.ignore_eos = p.stop().ignore_eos();
  r.cache_salt = p.cache_salt();
  if (p.has_session()) {
    const auto& keep = p.session().keep();
    if (keep.seconds() < 0 || keep.nanos() < 0 || keep.nanos() >= 1000000000) {
      return absl::InvalidArgumentError("session.keep must not be negative");
    }
    r.session_keep = absl::Seconds(keep.seconds()) + absl::Nanoseconds(keep.nanos());
    r.session_pin = p.session().pin();
  }
  return r;
}

void ToProto(const GenerateRequest& r, v1::GenerateRequest* out) {
  out->set_request_id(r.request_id);
  out->mutable_prompt_token_ids()->Assign(r.prompt.begin(), r.prompt.end());
  v1::SamplingParams* s = out->mutable_sampling();
  s->set_temperature(r.sampling.temperature);
  s->set_top_p(r.sampling.top_p);
  s->set_top_k(r.sampling.top_k);
  s->set_seed(r.sampling.seed);
  out->set_return_logprobs(r.sampling.logprobs);
  out->set_top_logprobs(static_cast<uint32_t>(r.sampling.top_logprobs));
  v1::StopConditions* stop = out->mutable_stop();
  stop->set_max_tokens(static_cast<uint32_t>(r.stop.max_tokens));
  stop->mutable_stop_token_ids()->Assign(r.stop.stop_token_ids.begin(), r.stop.stop_token_ids.end());
  for (const auto& seq : r.stop.stop_sequences) {
    stop->add_stop_sequences()->mutable_token_ids()->Assign(seq.begin(), seq.end());
  }
  stop->set_ignore_eos(r.stop.ignore_eos);
  out->set_cache_salt(r.cache_salt);
  if (r.session_keep != absl::ZeroDuration() || r.session_pin) {
    const int64_t nanos = absl::ToInt64Nanoseconds(r.session_keep);
    out->mutable_session()->mutable_keep()->set_seconds(nanos / 1000000000);
    out->mutable_session()->mutable_keep()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
    out->mutable_session()->set_pin(r.session_pin);
  }
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAborted:
      return v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::ResumeKind ToProto(ResumeKind kind) {
  switch (kind) {
    case ResumeKind::kCold:
      return v1::RESUME_KIND_COLD;
    case ResumeKind::kGridCheckpoint:
      return v1::RESUME_KIND_GRID_CHECKPOINT;
    case ResumeKind::kExactPrefix:
      return v1::RESUME_KIND_EXACT_PREFIX;
  }
  return v1::RESUME_KIND_UNSPECIFIED;
}

ResumeKind FromProto(v1::ResumeKind kind) {
  switch (kind) {
    case v1::RESUME_KIND_GRID_CHECKPOINT:
      return ResumeKind::kGridCheckpoint;
    case v1::RESUME_KIND_EXACT_PREFIX:
      return ResumeKind::kExactPrefix;
    default:
      return ResumeKind::kCold;
  }
}

void ToProto(const Usage& u, v1::Usage* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(u.prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(u.completion_tokens));
  out->set_cached_tokens(static_cast<uint32_t>(u.cached_tokens));
  out->set_recomputed_tokens(static_cast<uint32_t>(u.recomputed_tokens));
  out->set_resume_kind(ToProto(u.resume_kind));
  if (u.has_session) {
    v1::SessionOutcome* s = out->mutable_session();
    s->set_published(u.session.published);
    if (u.session.keep > absl::ZeroDuration()) {
      const int64_t nanos = absl::ToInt64Nanoseconds(u.session.keep);
      s->mutable_keep()->set_seconds(nanos / 1000000000);
      s->mutable_keep()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
    }
    s->set_pinned(u.session.pinned);
    s->set_pin_refused_reason(u.session.pin_refused);
  }
}

}  // namespace hybridserve::decode
