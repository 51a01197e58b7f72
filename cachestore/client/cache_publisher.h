#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PUBLISHER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PUBLISHER_H_

// What both workers put into the cache, and the one set of rules they put it
// by (over CacheClient only):
//   - prefill publishes a prompt's pages the cache lacks, its grid
//     checkpoints and its prompt-end state;
//   - decode publishes a turn's pages past the prompt and its turn-end state.
// A Publication is a list of page puts in order (each page hangs under the
// one before it) and then state puts (each hangs under the page its position
// ends). The rules:
//   - a page put that answers ABORTED is being put by another writer (a
//     concurrent request with the same history): its node exists, the next
//     pages go on;
//   - FAILED_PRECONDITION ("the parent page is not in the cache") when the
//     parent is another writer's to put (prefill's prompt pages, on their way
//     behind its answer; or the writer an ABORTED named) is waited out, up to
//     parent_wait, parked beside the other publications: one waiting delays
//     no other; so is a state put that answers ABORTED (another writer's put
//     of the same state in flight: decode's turn end at the prompt's end,
//     and prefill's prompt-end state), which then finds the state present;
//   - any other page failure ends the pages; the states that needed them are
//     not tried (they could not hang); other states still are;
//   - a call that timed out (DEADLINE_EXCEEDED: a hung cachestore, not a dead
//     one, which refuses at once and costs nothing) starts a skip of the
//     worker's CacheBackoff (cache_backoff.h): meanwhile every put, and every
//     other cache call of the worker that shares it, skips the cache without
//     a call ("unavailable"), so a hung cache costs one timeout per backoff,
//     not one per request.
// A publication's pages, then its states, go in PutMany calls
// (CacheClient::PutMany), each up to max_put_many_bytes, and the rules above
// apply to each entry's answer in order. A cachestore older than PutMany
// (UNIMPLEMENTED) is logged and given one Put per entry for
// put_many_recheck, then asked again (it may have been upgraded since).
// Publications run on the publisher's thread, in arrival order (Publish), or
// on the caller's (PublishNow).
//
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/model_namespace.h"
#include "common/log_rate_limiter.h"

namespace hybridserve::cachestore {

// What became of a publication (given to its `done`).
struct PublicationResult {
  int64_t pages_put = 0;  // pages put that the cache did not hold yet
  // Parallel to Publication::states: the put's answer, or nothing when the
  // state was not put (it failed, or was not tried).
  std::vector<std::optional<PutResult>> states;
  // Empty when every put went in; otherwise the first failure's reason
  // (common::FailureReason of its status: "unavailable", "failed_precondition",
  // ..., "unavailable" too when the cache was being skipped) and message.
  std::string failure;
  std::string failure_message;
  // The failure came after waiting parent_wait for another writer's page.
  bool parent_wait_expired = false;
};

struct Publication {
  ClientNamespace ns;
  std::vector<std::pair<ClientPut, std::string>> pages;  // in order
  int64_t first_page = 0;  // the index of pages[0] in the sequence (page i holds tokens [i, i + 1) * page_size)
  std::vector<std::pair<ClientPut, std::string>> states;  // after the pages
  // `pages` holds every full page from page 0: ask the cache first (a probe)
  // which it lacks, and put only those (a failed probe puts them all: those
  // present answer already_present).
  bool probe_first = false;
  // The first put's parent page is another writer's to put (prefill
  // publishes the prompt's pages behind its answer): FAILED_PRECONDITION is
  // waited out (parent_wait).
  bool parent_from_other_writer = false;
  // Called once with the result, on the thread that ran the publication.
  // Must not block for long. May be empty.
  absl::AnyInvocable<void(PublicationResult)> done;
};

struct PublisherOptions {
  // Publications waiting to start; Publish blocks beyond (backpressure: a
  // slow cache slows the publishers' callers, it never grows memory).
  int64_t max_queued = 4;
  // Publications queued plus those the publisher holds (running, or parked
  // waiting for a parent); Publish blocks beyond. 0: no limit but max_queued.
  int64_t max_in_flight = 0;
  // How long a put waits for another writer's parent page (see above).
  absl::Duration parent_wait = absl::Seconds(2);
  // The worker's memory of a hung cache (see above), shared with its other
  // cache users. Null: the publisher keeps its own, of
  // cache_failure_backoff (zero: never skip).
  std::shared_ptr<CacheBackoff> backoff;
  absl::Duration cache_failure_backoff = absl::Seconds(1);
  // The most entry bytes in one PutMany (an entry larger than this goes
  // alone). A call's timeout covers all of its entries: 16 MiB is 1/8 s at
  // 1 Gbit/s, far inside the workers' 2 s --cache_timeout; 0 puts the entries
  // one a call.
  int64_t max_put_many_bytes = int64_t{16} << 20;
  // After the cachestore answered PutMany UNIMPLEMENTED, how long entries go
  // one Put each before PutMany is tried again (>= 0).
  absl::Duration put_many_recheck = absl::Minutes(5);
};

// Cumulative, for metrics and tests.
struct PublisherCounters {
  int64_t pages_published = 0;   // pages put that the cache did not hold yet
  int64_t states_published = 0;  // states likewise
  // Failed puts (a skipped publication counts once), and by reason.
  int64_t failures = 0;
  std::map<std::string, int64_t> failures_by_reason;
  int64_t parent_waits_expired = 0;  // publications that gave up waiting for a parent
};

class CachePublisher {
 public:
  // `cache` must outlive the publisher. INVALID_ARGUMENT for a negative
  // duration, max_queued < 1 or max_in_flight < 0.
  static absl::StatusOr<std::unique_ptr<CachePublisher>> Create(CacheClient& cache, const PublisherOptions& options);
  // Runs what is queued (parked publications give up waiting at once, not
  // counted as expired), then joins the thread.
  ~CachePublisher();

  // Queues `p` for the publisher's thread; blocks while the queue is full.
  void Publish(Publication p) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `p` on this thread (parking waits here) and returns its result; `p`'s
  // done is called too.
  PublicationResult PublishNow(Publication p) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until nothing is queued or held; false at the timeout.
  bool WaitIdle(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Publications queued or held by the publisher's thread.
  int64_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  PublisherCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);

  // The skip the publisher obeys and starts (options.backoff, or its own).
  CacheBackoff& backoff() const { return *backoff_; }

 private:
  struct Job;
  CachePublisher(CacheClient& cache, const PublisherOptions& options);

  // Puts what is left of `job`, in order. False when it must wait for a
  // parent page (job.retry_at says until when); true when done.
  bool Step(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Applies the rules to the answer `r` to job.next's put. False when the
  // job must wait for a parent page (parked at job.next); else job.next has
  // moved on.
  bool Apply(Job& job, const absl::StatusOr<PutResult>& r) ABSL_LOCKS_EXCLUDED(mu_);
  // `entries` in one PutMany, or one Put each once the cachestore answered
  // PutMany UNIMPLEMENTED.
  std::vector<absl::StatusOr<PutResult>> PutBatch(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries);
  // Counts a failed put and, when it is the first, makes it the result's.
  void Fail(Job& job, const absl::Status& status, absl::string_view what) ABSL_LOCKS_EXCLUDED(mu_);
  void Finish(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  CacheClient& cache_;
  const PublisherOptions options_;
  const std::shared_ptr<CacheBackoff> backoff_;  // never null
  common::LogRateLimiter log_limiter_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // taken off the queue by the thread, not finished
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  PublisherCounters counters_ ABSL_GUARDED_BY(mu_);
  // Until when entries go one Put each: the cachestore answered PutMany
  // UNIMPLEMENTED (absl::ToUnixNanos; 0: PutMany is used).
  std::atomic<int64_t> put_many_unimplemented_until_{0};
  std::thread thread_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PUBLISHER_H_
