#include "decode/generation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hybridserve::decode {
namespace {

absl::Status CheckIds(const std::vector<TokenId>& ids, int64_t vocab, const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRequest(const GenerateRequest& r, int64_t vocab, int64_t max_context) {
  if (r.request_id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (r.request_id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id has ", r.request_id.size(), " bytes, at most ", kMaxRequestIdBytes));
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
  RETURN_IF_ERROR(CheckIds(r.prompt, vocab, "prompt_token_ids"));
  RETURN_IF_ERROR(CheckIds(r.stop.stop_token_ids, vocab, "stop.stop_token_ids"));
  for (size_t i = 0; i < r.stop.stop_sequences.size(); ++i) {
    if (r.stop.stop_sequences[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop.stop_sequences[", i, "] is empty"));
    }
    RETURN_IF_ERROR(CheckIds(r.stop.stop_sequences[i], vocab, absl::StrCat("stop.stop_sequences[", i, "]")));
  }
  if (r.stop.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("stop.max_tokens must be >= 1, got ", r.stop.max_tokens));
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.stop.max_tokens > max_context) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids (", r.prompt.size(), ") plus stop.max_tokens (",
                                                   r.stop.max_tokens, ") exceed the context of ", max_context,
                                                   " tokens"));
  }
  if (absl::Status s = engine::ValidateSamplingParams(r.sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  if (r.session_keep < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session.keep must not be negative, got ", absl::FormatDuration(r.session_keep)));
  }
  return absl::OkStatus();
}

Usage UsageOf(const GenerateRequest& request, int64_t completion_tokens, const prefill::PrefillUsage& prefill) {
  Usage u;
  u.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  u.completion_tokens = completion_tokens;
  u.cached_tokens = prefill.cached_tokens;
  u.recomputed_tokens = prefill.recomputed_tokens;
  u.resume_kind = prefill.resume_kind;
  return u;
}

std::optional<FinishReason> StopReason(const StopConditions& stop, absl::Span<const TokenId> eos_token_ids,
                                       absl::Span<const TokenId> generated, TokenId* stop_token) {
  if (generated.empty()) return std::nullopt;
  const TokenId last = generated.back();
  const bool eos =
      !stop.ignore_eos && std::find(eos_token_ids.begin(), eos_token_ids.end(), last) != eos_token_ids.end();
  if (eos || std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), last) != stop.stop_token_ids.end()) {
    *stop_token = last;
    return FinishReason::kStop;
  }
  for (const std::vector<TokenId>& seq : stop.stop_sequences) {
    if (seq.size() <= generated.size() && std::equal(seq.rbegin(), seq.rend(), generated.rbegin())) {
      return FinishReason::kStop;
    }
  }
  if (static_cast<int64_t>(generated.size()) >= stop.max_tokens) return FinishReason::kLength;
  return std::nullopt;
}

prefill::PrefillRequest PrefillCallFor(const GenerateRequest& request) {
  prefill::PrefillRequest call;
  call.request_id = request.request_id;
  call.prompt = request.prompt;
  call.tenant = request.tenant;
  call.cache_salt = request.cache_salt;
  call.sampling = request.sampling;
  return call;
}

}  // namespace hybridserve::decode
