#include "worker/cache_shard_metrics.h"

#include "common/metrics.h"

namespace hybridserve::worker {

CacheShardMetrics::CacheShardMetrics(prometheus::Registry& r)
    : up_(common::GaugeFamily(r, "hybridserve_cache_shard_up",
                              "1 while the cachestore shard gets calls, 0 while it is skipped as down")),
      calls_(common::CounterFamily(r, "hybridserve_cache_shard_calls_total", "Calls sent to the cachestore shard")),
      failures_(common::CounterFamily(r, "hybridserve_cache_shard_failures_total",
                                      "Calls to the cachestore shard that ended UNAVAILABLE or DEADLINE_EXCEEDED "
                                      "(each marks it down)")),
      refused_(common::CounterFamily(r, "hybridserve_cache_shard_refused_total",
                                     "Calls on the cachestore shard's leases answered at once while it was down")) {}

void CacheShardMetrics::Sync(const std::vector<cachestore::ShardCounts>& now) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, last] : last_) up_.Add({{"shard", name}}).Set(0);
  for (const cachestore::ShardCounts& c : now) {
    const prometheus::Labels labels{{"shard", c.name}};
    cachestore::ShardCounts& last = last_[c.name];
    up_.Add(labels).Set(c.up ? 1 : 0);
    common::AdvanceCounter(calls_.Add(labels), c.calls, last.calls);
    common::AdvanceCounter(failures_.Add(labels), c.failures, last.failures);
    common::AdvanceCounter(refused_.Add(labels), c.refused, last.refused);
    last = c;
  }
}

}  // namespace hybridserve::worker
