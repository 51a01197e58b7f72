#ifndef HYBRIDSERVE_WORKER_SHM_PUT_METRICS_H_
#define HYBRIDSERVE_WORKER_SHM_PUT_METRICS_H_

// What a worker's cache puts by shared memory did (cachestore/
// shm_put_cache_client.h), which both worker binaries expose:
//
//   hybridserve_worker_shm_put_entries_total    entries the shm socket answered
//   hybridserve_worker_shm_put_bytes_total      their bytes
//   hybridserve_worker_shm_put_fallbacks_total{reason}
//                                               calls that went on over gRPC
//
// Thread-safe: Sync serializes on its own mutex.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/shm_put_cache_client.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {

class ShmPutMetrics {
 public:
  explicit ShmPutMetrics(prometheus::Registry& registry);

  // Advances the counters to `now` (cumulative; call it before each scrape).
  void Sync(const cachestore::ShmPutCounts& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Counter& entries_;
  prometheus::Counter& bytes_;
  prometheus::Family<prometheus::Counter>& fallbacks_;
  absl::Mutex mu_;
  cachestore::ShmPutCounts last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_SHM_PUT_METRICS_H_
