#ifndef HYBRIDSERVE_DECODE_LOCAL_PREFILL_H_
#define HYBRIDSERVE_DECODE_LOCAL_PREFILL_H_

// Decode's local prefill (DecodeLoopOptions::local_prefill_max_tokens): a
// request whose prompt the cache holds a state of, all but at most
// max_tokens tokens (a conversation's next turn), is prefilled in the decode
// worker's own engine instead of by a call to the prefill pool: the history
// is read once, into the sequence that then decodes, and nothing crosses a
// data plane. A probe of the cache (nothing leased) decides; the prefill is
// a PrefillWorker::PrefillAndKeep on the loop's engine, so the same resume,
// compute, sampling and publication as the pool's, and the same bits. Any
// failure sends the request to the pool; a probe that timed out starts the
// worker's cache backoff, which also skips the probes while it runs.
//
// Not thread-safe for TryPrefill (the loop thread calls it: it runs the
// engine); counts() may be called from any thread.

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/model_namespace.h"
#include "common/log_rate_limiter.h"
#include "decode/generation.h"
#include "engine/sequence_table.h"
#include "prefill/kept_prefill.h"
#include "prefill/prefill_client.h"

namespace hybridserve::decode {

// Prefills a request in the decode loop's own engine and keeps the sequence,
// its pages reserved for `reserve_positions`
// (prefill::PrefillWorker::PrefillAndKeep on the loop's model).
using KeepingPrefill = std::function<absl::StatusOr<prefill::KeptPrefill>(const prefill::PrefillRequest& request,
                                                                          int64_t reserve_positions)>;

class LocalPrefill {
 public:
  // `cache` and `backoff` must outlive this; `prefill` runs on the caller's
  // thread, in the engine `table` belongs to. max_tokens >= 1.
  LocalPrefill(cachestore::CacheClient& cache, const cachestore::ModelNamespace& ns, cachestore::CacheBackoff& backoff,
               int64_t max_tokens, KeepingPrefill prefill);

  // Prefills `request` here when the cache holds its prompt all but at most
  // max_tokens and `table` has room for it (a state slot, pages for prompt +
  // max_tokens); the kept sequence, live at the prompt's end, is the
  // caller's. nullopt when the pool is to take it: a new prompt, no room, the
  // cache skipped or failing, or a failed prefill (counted, logged).
  std::optional<prefill::KeptPrefill> TryPrefill(const GenerateRequest& request, const engine::SequenceTable& table)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Counts {
    int64_t prefills = 0;
    int64_t failures = 0;  // local prefills that failed (the pool took the request)
    int64_t tokens = 0;    // the tokens they computed (the uncached ones)
    // Where their time went, summed: the probe, lookup, fetch and restore;
    // the engine's prefill and the first token's sampling.
    absl::Duration resume;
    absl::Duration compute;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  cachestore::CacheClient& cache_;
  const cachestore::ModelNamespace namespace_;
  cachestore::CacheBackoff& backoff_;
  const int64_t max_tokens_;
  const KeepingPrefill prefill_;
  common::LogRateLimiter log_limiter_;
  mutable absl::Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_LOCAL_PREFILL_H_
