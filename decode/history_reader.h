#ifndef HYBRIDSERVE_DECODE_HISTORY_READER_H_
#define HYBRIDSERVE_DECODE_HISTORY_READER_H_

// Decode's reads of a prompt's cached pages into its own reservation
// (DecodeLoopOptions::read_history_pages; transport/transfer.h "Held pages"):
// on the prefill call's thread, before the call, the longest run of the
// prompt's full pages the cache holds is read (leased, then released) straight
// into the reserved slots, and prefill is asked to send only the pages after
// them. Any failure is a miss (prefill sends every page, over what was
// written); one that timed out starts the worker's cache backoff, which also
// skips the reads while it runs.
//
// Thread-safe: Views on the loop thread, Read on any number of call threads.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/model_namespace.h"
#include "common/log_rate_limiter.h"
#include "engine/sequence_table.h"
#include "prefill/prefill_client.h"
#include "transport/transfer.h"

namespace hybridserve::decode {

struct HistoryReaderOptions {
  // Only for prompts whose full pages hold at least this many bytes (>= 0).
  int64_t min_bytes = int64_t{4} << 20;
  // Cache reads in flight while reading them (>= 1).
  int64_t streams = 2;
};

class HistoryReader {
 public:
  // The reserved slots of a prompt's full pages, as host memory.
  using PageViews = std::vector<std::vector<absl::Span<char>>>;

  // `cache` and `backoff` must outlive the reader.
  HistoryReader(cachestore::CacheClient& cache, const cachestore::ModelNamespace& ns, cachestore::CacheBackoff& backoff,
                const HistoryReaderOptions& options);

  // The host views of `reservation`'s pages when a read applies to it (a
  // plane that takes held pages, enough bytes, a pool the host can write);
  // empty otherwise. On the loop thread (it reads the sequence table).
  PageViews Views(const engine::SequenceTable& table, const engine::ImportReservation& reservation,
                  const transport::Ticket& ticket) const;
  // Reads the longest run of `call`'s prompt pages the cache holds into
  // `views`; the pages read, 0 on a miss, any failure, or while the cache
  // backoff runs.
  int64_t Read(const prefill::PrefillRequest& call, const PageViews& views) ABSL_LOCKS_EXCLUDED(mu_);

  struct Counts {
    int64_t reads = 0;     // prompts whose pages were read
    int64_t failures = 0;  // reads that failed (prefill sent every page)
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  cachestore::CacheClient& cache_;
  const cachestore::ModelNamespace namespace_;
  cachestore::CacheBackoff& backoff_;
  const HistoryReaderOptions options_;
  common::LogRateLimiter log_limiter_;
  mutable absl::Mutex mu_;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_HISTORY_READER_H_
