#ifndef HYBRIDSERVE_PREFILL_PREFILL_WORKER_H_
#define HYBRIDSERVE_PREFILL_PREFILL_WORKER_H_

// The prefill worker's core (docs/ARCHITECTURE.md sections 3 and 4), below its gRPC
// edge: for one request it
//   1. looks up the deepest resume point of the prompt in the request's
//      namespace (model fingerprint, adapter, cache salt, page size), fetches
//      the state and pages under the lease and restores them;
//   2. prefills the rest on the absolute chunk grid, keeping the grid
//      checkpoints it crosses;
//   3. samples the first token (step 0) from the last prompt logits;
//   4. pushes pages, the prompt-end state and the first token to the
//      decode worker's reservation (the ticket) over the data plane;
//   5. then publishes to the cache what it computed: the prompt's pages not
//      yet cached, its grid checkpoints and the prompt-end exact-prefix
//      snapshot (with its last logits, so an identical prompt recomputes
//      nothing).
// The cache being down, slow, wrong or full never fails a request: a lookup
// or fetch that fails, bytes that fail their checksum, a snapshot of another
// model, layout, position or prefix all become a miss, and the request
// recomputes; failed publications are counted and dropped.
//
// Not thread-safe: the engine is not. One worker per engine; the service in
// front of it queues requests (bounded) and calls Prefill one at a time.
// counters() and WaitForPublications may be called from any thread.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/client/cache_publisher.h"
#include "cachestore/model_namespace.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"
#include "common/tokens.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "prefill/kept_prefill.h"
#include "prefill/prefill_client.h"
#include "transport/transfer.h"

namespace hybridserve::prefill {

// What the worker did with the cache (cumulative; for metrics and tests).
struct PrefillCacheCounters {
  int64_t lookups = 0;
  int64_t hits = 0;              // resumed from a state
  int64_t errors_as_misses = 0;  // cache calls or bytes that failed and became misses
  int64_t pages_published = 0;
  int64_t states_published = 0;
  int64_t publish_failures = 0;
  // publish_failures by reason (common::FailureReason of the failing put).
  std::map<std::string, int64_t> publish_failures_by_reason;
  int64_t cancelled = 0;  // calls abandoned because the caller cancelled
  // Pushes to decode workers under way now, and those that failed.
  int64_t transfers_in_flight = 0;
  // Publications queued or being put (CachePublisher::in_flight): the work
  // behind the answers that is still to do.
  int64_t publications_in_flight = 0;
  int64_t transfer_failures = 0;
};

struct PrefillWorkerOptions {
  std::string adapter;  // part of the namespace ("" for the base model)
  bool publish = true;  // publish pages, checkpoints and prompt-end snapshots
  // Put the publications on a publisher thread (the bytes are copied out of
  // the engine first), so Prefill returns right after the push; at most
  // max_pending_publications wait (beyond, Prefill waits). Off: Prefill puts
  // them itself before it returns.
  bool async_publication = false;
  int64_t max_pending_publications = 4;
  // Cache calls in flight at once while resuming: the state's Get, and the
  // pages split into fetch_parallelism - 1 GetMany streams (at least one).
  // One Get per page, one after another, took ~60% of a 16K-token warm TTFT.
  int64_t fetch_parallelism = 3;
  // After a cache call fails with DEADLINE_EXCEEDED (the cachestore hung
  // until the call's timeout), lookups and publications skip the cache for
  // this long (misses; publications counted failed, "unavailable"): a hung
  // cache costs one timeout per backoff, not one per request. A cachestore
  // that is down refuses at once (UNAVAILABLE) and is not skipped: its
  // return is seen at the next call. Zero: never skip.
  absl::Duration cache_failure_backoff = absl::Seconds(1);
  // The process's one memory of a hung cache (cachestore/client/cache_backoff.h),
  // shared with its other cache users (decode's loop, when this worker
  // prefills inside decode). Null: the worker keeps its own, of
  // cache_failure_backoff.
  std::shared_ptr<cachestore::CacheBackoff> cache_backoff;
  // Admission of grid checkpoints (docs/ARCHITECTURE.md section 4,
  // "Admission"): the engine's checkpoint at q is published when q is a
  // multiple of this, a multiple of the engine's checkpoint_interval (0: every
  // one; -1: none, so states only at prompt ends, turn ends and branch points).
  // Whatever it is, the branch-point rule publishes the engine checkpoint at
  // or below the point where the prompt leaves the pages the cache holds
  // (kv_match_tokens) when that lies past the resume point: the next prompt
  // sharing that prefix resumes there. Grid checkpoints keep contract 1.
  int64_t checkpoint_publish_interval = 0;
};

class PrefillWorker {
 public:
  // `model`, `cache` (null: no cache) and `sender` must outlive the worker.
  // `model_fingerprint` identifies the weights (ModelWeights::fingerprint()).
  // The options' durations and sizes must be valid (main checks the flags).
  PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint, cachestore::CacheClient* cache,
                transport::StateSender& sender, const PrefillWorkerOptions& options = {});
  // A worker without a data plane, for PrefillAndKeep only: Prefill answers
  // FAILED_PRECONDITION. Decode's local prefill runs one on decode's engine.
  PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint, cachestore::CacheClient* cache,
                const PrefillWorkerOptions& options = {});

  // Runs steps 1-5 for `request`. INVALID_ARGUMENT for an empty prompt, a
  // token outside the vocabulary, bad sampling params or a ticket for another
  // position or model layout; RESOURCE_EXHAUSTED when the engine has no room
  // for the sequence; CANCELLED when request.cancellation fired (checked
  // before the lookup, between the engine's prefill segments and before the
  // push); the data plane's error when the push fails. The engine holds nothing of the request afterwards, whatever
  // the outcome.
  absl::StatusOr<PrefillOutcome> Prefill(const PrefillRequest& request);

  // Steps 1-3 and 5 without the push (request.ticket is not read): the
  // prefilled sequence stays in the engine with pages reserved for
  // `reserve_positions` (>= the prompt) and is the caller's to release. The
  // same resume, compute, sampling and publication as Prefill, so the same
  // bits. INVALID_ARGUMENT as Prefill (and for reserve_positions below the
  // prompt); RESOURCE_EXHAUSTED when the engine has no slot or too few pages;
  // CANCELLED as Prefill. The engine holds nothing of the request on error.
  absl::StatusOr<KeptPrefill> PrefillAndKeep(const PrefillRequest& request, int64_t reserve_positions);

  // A snapshot of the counters (any thread).
  // The publication counts are the publisher's (PublisherCounters).
  PrefillCacheCounters counters() const ABSL_LOCKS_EXCLUDED(counters_mu_);
  // The engine's free KV pages and state slots. Like Prefill, not while
  // another call is in the engine.
  int64_t free_pages() const { return model_.sequences().num_free_pages(); }
  int64_t free_slots() const { return model_.sequences().num_free_slots(); }
  // With async_publication: waits until every queued publication is put;
  // false at the timeout.
  bool WaitForPublications(absl::Duration timeout);
  // Puts what is still queued, then stops the publisher.
  ~PrefillWorker() = default;
  // The namespace a request of `tenant` with `cache_salt` uses.
  // The request's namespace, placed by its prompt's chain.
  cachestore::ClientNamespace Namespace(const PrefillRequest& request) const;

 private:
  struct Resumed;
  struct Computed;
  PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint, cachestore::CacheClient* cache,
                transport::StateSender* sender, const PrefillWorkerOptions& options);
  // Checks the prompt's tokens (INVALID_ARGUMENT).
  absl::Status CheckPrompt(absl::Span<const TokenId> prompt) const;
  // CANCELLED (counted) once request.cancellation has fired.
  absl::Status CheckCancelled(const PrefillRequest& request);
  // Steps 1-3 for a checked request (cancellation checked at its end too):
  // on success the caller owns computed.resumed.seq; on error nothing is left
  // in the engine.
  absl::StatusOr<Computed> Compute(const PrefillRequest& request, const cachestore::ClientNamespace& ns,
                                   engine::Sampler& sampler);
  // Step 5: publishes what `computed` holds (with a cache, publishing, and
  // the cache reachable), and says so in outcome->publishes_prompt.
  void PublishPrompt(const Computed& computed, const PrefillRequest& request, const cachestore::ClientNamespace& ns,
                     PrefillOutcome* outcome);
  // Steps 1: a live sequence at the deepest usable resume point (position 0
  // when cold), and how it got there.
  absl::StatusOr<Resumed> Resume(const PrefillRequest& request, const cachestore::ClientNamespace& ns);
  // Tries to restore `seq` from the lookup's lease; false (a miss) on any failure.
  // Fetches the lookup's state under its lease into `state` on this thread
  // while `fetch_pages(begin, end)` fetches its pages [begin, end) in up to
  // fetch_parallelism - 1 contiguous slices, one call each on a helper
  // thread; the first error.
  absl::Status FetchResumeBytes(const cachestore::LookupResult& lookup, int64_t pages, std::string* state,
                                absl::FunctionRef<absl::Status(int64_t begin, int64_t end)> fetch_pages);
  // Resumes `seq` from the lookup's entries; false (a miss, logged and
  // counted) when the restore failed and changed nothing.
  bool RestoreFromCache(engine::SequenceId seq, const cachestore::LookupResult& lookup, int64_t prompt_tokens,
                        const common::Hash128& prefix_hash);
  // The pages read by the cache client straight into the sequence's pool
  // pages (SequenceTable::BeginRestoreInPlace gave `regions`), then the rest
  // of the state; the pages go back on any error.
  absl::Status RestoreInPlace(engine::SequenceId seq, const cachestore::LookupResult& lookup,
                              const engine::SnapshotExpectation& expect,
                              const std::vector<std::vector<absl::Span<char>>>& regions);
  // The pages read into strings first, then copied in by Restore (a backend
  // whose memory the host cannot address).
  absl::Status RestoreThroughBuffers(engine::SequenceId seq, const cachestore::LookupResult& lookup,
                                     const engine::SnapshotExpectation& expect);
  // The publication of a prompt's pages the cache lacks, its grid
  // checkpoints and its prompt-end state, copied out of the engine.
  cachestore::Publication Prepare(engine::SequenceId seq, const PrefillRequest& request,
                                  const cachestore::ClientNamespace& ns, int64_t resumed_at, int64_t kv_match_tokens,
                                  const std::vector<engine::SequenceState>& checkpoints);
  void Count(int64_t PrefillCacheCounters::*field, int64_t n = 1) ABSL_LOCKS_EXCLUDED(counters_mu_);

  engine::Model& model_;
  const common::Hash128 fingerprint_;
  const cachestore::ModelNamespace namespace_;
  cachestore::CacheClient* const cache_;
  transport::StateSender* const sender_;  // null: PrefillAndKeep only
  const PrefillWorkerOptions options_;
  // With a cache: puts the publications (and says when to skip the cache).
  std::unique_ptr<cachestore::CachePublisher> publisher_;
  mutable absl::Mutex counters_mu_;
  PrefillCacheCounters counters_ ABSL_GUARDED_BY(counters_mu_);
  common::LogRateLimiter log_limiter_;
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_PREFILL_WORKER_H_
