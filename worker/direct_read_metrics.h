#ifndef HYBRIDSERVE_WORKER_DIRECT_READ_METRICS_H_
#define HYBRIDSERVE_WORKER_DIRECT_READ_METRICS_H_

// What a worker's cache reads by a direct path did (cachestore/
// direct_read_cache_client.h: shared memory, or the bulk port), under the
// worker's prefix (hybridserve_prefill_cache, hybridserve_decode_cache):
//
//   PREFIX_shm_reads_total, PREFIX_bulk_reads_total     reads the path served
//   PREFIX_shm_bytes_total, PREFIX_bulk_bytes_total     their entry bytes
//   PREFIX_shm_fallbacks_total{reason}, PREFIX_bulk_fallbacks_total{reason}
//                                                       reads that went to gRPC
//
// Every reason series (common::DeclareFailureReasons) exists at 0 from the
// start, so a scrape declares both fallback families before any failure.
// Thread-safe: Sync serializes on its own mutex.

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/client/direct_read_cache_client.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {

class DirectReadMetrics {
 public:
  DirectReadMetrics(prometheus::Registry& registry, const std::string& prefix);

  // Advances the counters of now.path ("shm" or "bulk") to `now` (cumulative,
  // of that path: with cachestore shards, summed over the shards that use
  // it; call it before each scrape).
  void Sync(const cachestore::DirectReadCounts& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One path's counters.
  struct Path {
    prometheus::Counter& reads;
    prometheus::Counter& bytes;
    prometheus::Family<prometheus::Counter>& fallbacks;
  };
  static Path Register(prometheus::Registry& r, const std::string& prefix, const std::string& path,
                       const std::string& what);

  Path shm_;
  Path bulk_;
  absl::Mutex mu_;
  std::map<std::string, cachestore::DirectReadCounts> last_ ABSL_GUARDED_BY(mu_);  // by path
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_DIRECT_READ_METRICS_H_
