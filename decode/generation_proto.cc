#include "decode/generation_proto.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "prefill/prefill_client.h"

namespace hybridserve::decode {
namespace {

using ::google::protobuf::util::TimeUtil;

// The sampling a request asks for, with the proto's defaults applied.
absl::StatusOr<engine::SamplingParams> SamplingFromProto(const v1::GenerateRequest& p) {
  engine::SamplingParams out;
  const v1::SamplingParams& s = p.sampling();
  out.temperature = s.has_temperature() ? s.temperature() : 1.0f;
  out.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  out.top_k = s.has_top_k() ? s.top_k() : 0;
  out.seed = s.has_seed() ? s.seed() : engine::SeedFromRequestId(p.request_id());
  out.logprobs = p.return_logprobs() || p.top_logprobs() > 0;
  if (p.top_logprobs() > static_cast<uint32_t>(engine::kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs ", p.top_logprobs(), " is above the limit of ", engine::kMaxTopLogprobs));
  }
  out.top_logprobs = static_cast<int32_t>(p.top_logprobs());
  return out;
}

// generation.proto's ResumeKind. Decode's own mapping: prefill's
// (prefill_proto.h) belongs to prefill's edge.
v1::ResumeKind ResumeKindToProto(prefill::ResumeKind kind) {
  switch (kind) {
    case prefill::ResumeKind::kCold:
      return v1::RESUME_KIND_COLD;
    case prefill::ResumeKind::kGridCheckpoint:
      return v1::RESUME_KIND_GRID_CHECKPOINT;
    case prefill::ResumeKind::kExactPrefix:
      return v1::RESUME_KIND_EXACT_PREFIX;
  }
  return v1::RESUME_KIND_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<GenerateRequest> FromProto(const v1::GenerateRequest& p) {
  GenerateRequest r;
  r.request_id = p.request_id();
  r.prompt.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  absl::StatusOr<engine::SamplingParams> sampling = SamplingFromProto(p);
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
    r.session_keep = absl::Nanoseconds(TimeUtil::DurationToNanoseconds(keep));
    r.session_pin = p.session().pin();
  }
  return r;
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

void ToProto(const Usage& u, v1::Usage* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(u.prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(u.completion_tokens));
  out->set_cached_tokens(static_cast<uint32_t>(u.cached_tokens));
  out->set_recomputed_tokens(static_cast<uint32_t>(u.recomputed_tokens));
  out->set_resume_kind(ResumeKindToProto(u.resume_kind));
  if (u.has_session) {
    v1::SessionOutcome* s = out->mutable_session();
    s->set_published(u.session.published);
    if (u.session.keep > absl::ZeroDuration()) {
      *s->mutable_keep() = TimeUtil::NanosecondsToDuration(absl::ToInt64Nanoseconds(u.session.keep));
    }
    s->set_pinned(u.session.pinned);
    s->set_pin_refused_reason(u.session.pin_refused);
  }
}

}  // namespace hybridserve::decode
