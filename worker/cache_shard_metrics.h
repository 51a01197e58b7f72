#ifndef HYBRIDSERVE_WORKER_CACHE_SHARD_METRICS_H_
#define HYBRIDSERVE_WORKER_CACHE_SHARD_METRICS_H_

// Each cachestore shard as a worker sees it (cachestore/client/
// sharded_cache_client.h), labelled by the shard's name:
//
//   hybridserve_cache_shard_up{shard}              1 while calls go to it, 0 while it is skipped
//   hybridserve_cache_shard_calls_total{shard}     calls sent to it
//   hybridserve_cache_shard_failures_total{shard}  of them, UNAVAILABLE or DEADLINE_EXCEEDED (each marks it down)
//   hybridserve_cache_shard_refused_total{shard}   calls answered at once while it was down (its leases)
//
// A shard that leaves the set keeps its series (up 0). Thread-safe: Sync
// serializes on its own mutex.

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/client/sharded_cache_client.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {

class CacheShardMetrics {
 public:
  explicit CacheShardMetrics(prometheus::Registry& registry);

  // Advances every series to `now` (ShardedCacheClient::counts(); call it
  // before each scrape).
  void Sync(const std::vector<cachestore::ShardCounts>& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Family<prometheus::Gauge>& up_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& refused_;
  absl::Mutex mu_;
  std::map<std::string, cachestore::ShardCounts> last_ ABSL_GUARDED_BY(mu_);  // by name
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_CACHE_SHARD_METRICS_H_
