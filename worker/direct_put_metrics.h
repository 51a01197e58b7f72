#ifndef HYBRIDSERVE_WORKER_DIRECT_PUT_METRICS_H_
#define HYBRIDSERVE_WORKER_DIRECT_PUT_METRICS_H_

// What a worker's cache puts by a direct path did (cachestore/
// direct_put_cache_client.h: shared memory, or the bulk port), which both
// worker binaries expose:
//
//   hybridserve_worker_direct_put_entries_total{path}   entries the path answered
//   hybridserve_worker_direct_put_bytes_total{path}     their bytes
//   hybridserve_worker_direct_put_fallbacks_total{path,reason}
//                                                       calls that went on over gRPC
//
// `path` is "shm" or "bulk". The first Sync of a path creates its fallbacks'
// series at 0 for every reason (common::DeclareFailureReasons), so a scrape
// declares the family before any failure. Thread-safe: Sync serializes on its
// own mutex.

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/client/direct_put_cache_client.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {

class DirectPutMetrics {
 public:
  explicit DirectPutMetrics(prometheus::Registry& registry);

  // Advances the counters of now.path to `now` (cumulative, of that path:
  // with cachestore shards, summed over the shards that use it; call it
  // before each scrape).
  void Sync(const cachestore::DirectPutCounts& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Family<prometheus::Counter>& entries_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& fallbacks_;
  absl::Mutex mu_;
  std::map<std::string, cachestore::DirectPutCounts> last_ ABSL_GUARDED_BY(mu_);  // by path
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_DIRECT_PUT_METRICS_H_
