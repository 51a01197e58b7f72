#ifndef HYBRIDSERVE_DECODE_GENERATION_H_
#define HYBRIDSERVE_DECODE_GENERATION_H_

// The decode worker's domain types (the gRPC edge converts
// proto/generation.proto to and from them) and the validation of a request.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tokens.h"
#include "engine/sampler.h"
#include "prefill/prefill_client.h"

namespace hybridserve::decode {

inline constexpr size_t kMaxRequestIdBytes = 256;

struct StopConditions {
  int64_t max_tokens = 0;  // >= 1
  std::vector<TokenId> stop_token_ids;
  std::vector<std::vector<TokenId>> stop_sequences;  // each non-empty
  bool ignore_eos = false;
};

struct GenerateRequest {
  // The client's id: 1..kMaxRequestIdBytes, unique among the tenant's live
  // requests (the loop scopes it by the tenant: decode/tenant.h).
  std::string request_id;
  std::vector<TokenId> prompt;
  engine::SamplingParams sampling;  // seed: SeedFromRequestId when the client gave none
  StopConditions stop;
  // The cache namespace's tenant (set by the service from the authenticated
  // caller, decode/tenant.h; never by the client) and the client's salt.
  std::string tenant;
  std::string cache_salt;
  absl::Time deadline = absl::InfiniteFuture();
  // Session breakpoint (proto SessionRetention): the turn-end state's TTL
  // (zero: the cache's default; >= 0) and pin.
  absl::Duration session_keep = absl::ZeroDuration();
  bool session_pin = false;
};

enum class FinishReason {
  kStop = 0,     // EOS, a stop token id or a stop sequence
  kLength = 1,   // max_tokens, or the context length
  kAborted = 2,  // client cancel, Abort or deadline
  kError = 3,
};

// What became of the turn-end state (proto SessionOutcome).
struct SessionOutcome {
  bool published = false;
  absl::Duration keep = absl::ZeroDuration();
  bool pinned = false;
  std::string pin_refused;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // as prefill reported it (PrefillUsage)
  int64_t recomputed_tokens = 0;
  prefill::ResumeKind resume_kind = prefill::ResumeKind::kCold;
  bool has_session = false;  // the request ended normally: `session` says what was published
  SessionOutcome session;
};

// What became of a request's turn-end publication (metrics and logs).
struct PublicationReport {
  bool attempted = false;  // the request ended normally and there is a cache
  // From the end of the request to its final message: the puts, and any wait
  // for prefill's parent page.
  absl::Duration wait = absl::ZeroDuration();
  // Empty when the state was published; otherwise why not: the failing put's
  // status code in lower case ("unavailable", "failed_precondition", ...), or
  // "export" when the bytes could not be copied out of the engine.
  std::string failure;
  // It failed after waiting publish_parent_wait for prefill's parent page.
  bool parent_wait_expired = false;
  int64_t pages = 0;  // pages put (not already present)
};

struct Completion {
  FinishReason reason = FinishReason::kStop;
  TokenId stop_token_id = -1;  // the token that ended a kStop by id or EOS
  Usage usage;
  absl::Status error;  // kError and kAborted: why
  PublicationReport publication;
};

// Where a request's tokens go, in order: any number of OnToken (from the
// decode loop's thread), then exactly one OnComplete (from the loop thread, or
// from its publisher thread after the turn end was published). Must not block
// for long (the whole batch waits).
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnToken(const engine::SampledToken& token) = 0;
  virtual void OnComplete(const Completion& completion) = 0;
};

// OK, or INVALID_ARGUMENT naming the first bad field: request_id (the
// client's, whatever the tenant) empty or over kMaxRequestIdBytes; prompt empty; any id (prompt, stop ids, stop
// sequences) outside [0, vocab); an empty stop sequence; max_tokens < 1; prompt plus max_tokens beyond `max_context`;
// sampling out of range.
absl::Status ValidateRequest(const GenerateRequest& request, int64_t vocab, int64_t max_context);

// The usage of a request that generated `completion_tokens`, its prompt
// resumed as prefill reported (`prefill`).
Usage UsageOf(const GenerateRequest& request, int64_t completion_tokens, const prefill::PrefillUsage& prefill);

// Whether the tokens sampled so far (`generated`, the last one just now) end
// a request: EOS unless ignore_eos, or a stop id (kStop, `*stop_token` set
// to it); a stop sequence that `generated` ends with (kStop); max_tokens
// reached (kLength). nullopt: it goes on.
std::optional<FinishReason> StopReason(const StopConditions& stop, absl::Span<const TokenId> eos_token_ids,
                                       absl::Span<const TokenId> generated, TokenId* stop_token);

// The prefill call for `request`: its id, prompt, tenant, salt and sampling.
// The ticket and the cancellation are the caller's to add (a local prefill
// has neither).
prefill::PrefillRequest PrefillCallFor(const GenerateRequest& request);

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_GENERATION_H_
