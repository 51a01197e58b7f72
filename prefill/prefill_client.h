#ifndef HYBRIDSERVE_PREFILL_PREFILL_CLIENT_H_
#define HYBRIDSERVE_PREFILL_PREFILL_CLIENT_H_

// The prefill contract, in prefill's domain types: what a prefill call asks
// (PrefillRequest), what it answers (PrefillOutcome), and the interface a
// caller reaches a prefill worker through (PrefillClient). Decode calls it;
// three things implement or serve it:
//   - PrefillWorker (prefill_worker.h): the work itself, in this process;
//   - InProcessPrefillClient (in_process_prefill_client.h): a worker in the
//     caller's process (aggregated mode);
//   - GrpcPrefillClient (grpc_prefill_client.h): a pool of prefill workers
//     over proto/prefill.proto, whose PrefillService (service.h) runs a
//     PrefillWorker. prefill_proto.h converts these types to and from it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/tokens.h"
#include "engine/sampler.h"
#include "transport/transfer.h"

namespace hybridserve::prefill {

// How a prompt was resumed.
enum class ResumeKind {
  kCold = 0,            // nothing usable in the cache
  kGridCheckpoint = 1,  // from a grid checkpoint
  kExactPrefix = 2,     // from an exact-prefix snapshot (an earlier prompt or turn end)
};

struct PrefillRequest {
  std::string request_id;
  std::vector<TokenId> prompt;
  // The cache namespace's tenant and salt (cachestore/keys.h): the tenant
  // decode derived from its authenticated client (decode/tenant.h), the salt
  // the client chose. Prefill trusts the tenant because only decode workers'
  // identities may call it (--tls_allowed_peers).
  std::string tenant;
  std::string cache_salt;
  // Resolved by the caller (no defaults left): the first token is sampled
  // with it at step 0.
  engine::SamplingParams sampling;
  // Where the state goes. Its deadline is the call's: after it the receiver
  // refuses late bytes, and a gRPC call is given up.
  transport::Ticket ticket;
  // Cancelled once the caller no longer wants the answer (its request was
  // cancelled, aborted or ran out of time): a waiting call gives up, a
  // running one stops between prefill segments. Null: never.
  std::shared_ptr<common::Cancellation> cancellation;
  // When every worker is unreachable, fail at once (UNAVAILABLE) instead of
  // waiting up to the pool's unavailable_wait for one to come back: the caller
  // has somewhere else to go (decode prefills itself while its calls fail,
  // decode/decode_loop.h fallback_prefill_max_tokens). Not carried over gRPC.
  bool skip_unavailable_wait = false;
};

struct PrefillUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // tokens whose state came from the cache
  // Tokens whose KV pages were cached but that were prefilled again for want
  // of a state at a deeper point: kv match depth (within the prompt) minus
  // cached_tokens, at least 0 (proto/generation.proto Usage).
  int64_t recomputed_tokens = 0;
  int64_t kv_match_tokens = 0;  // tokens the cache held pages for (may exceed cached_tokens)
  ResumeKind resume_kind = ResumeKind::kCold;
};

struct PrefillOutcome {
  engine::SampledToken first;  // step 0
  PrefillUsage usage;
  int64_t transfer_bytes = 0;
  absl::Duration transfer_time;
  // Where the call's time went: the cache lookup, fetch and restore; the
  // engine's prefill of the tokens past the resume point and the first
  // token's sampling; transfer_time is the push. Not carried over gRPC.
  absl::Duration resume_time;
  absl::Duration compute_time;
  // The prompt's full pages and its prompt-end state are put to the cache by
  // the prefill worker (done, or queued behind the answer): decode's turn-end
  // publication adds only the pages past the prompt. False without a cache,
  // and when the call found the cache unreachable (its lookup failed): then
  // the worker puts nothing and decode publishes from the first page the
  // cache lacks, instead of waiting for pages that would never come.
  bool publishes_prompt = false;
};

// A way to a prefill worker. Thread-safe; Prefill blocks until the state has
// been pushed to the ticket's receiver (or failed), and returns CANCELLED
// soon after the request's cancellation fires. A prefill pool that is busy
// (RESOURCE_EXHAUSTED) is not an error of an admitted request: the call
// waits for room until the ticket's deadline.
class PrefillClient {
 public:
  virtual ~PrefillClient() = default;
  virtual absl::StatusOr<PrefillOutcome> Prefill(const PrefillRequest& request) = 0;
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_PREFILL_CLIENT_H_
