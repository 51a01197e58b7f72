#include "worker/direct_put_metrics.h"

#include <cstdint>
#include <string>

#include "common/metrics.h"

namespace hybridserve::worker {

DirectPutMetrics::DirectPutMetrics(prometheus::Registry& r)
    : entries_(common::CounterFamily(
          r, "hybridserve_worker_direct_put_entries_total",
          "Cache entries put by a direct path (shm: the cachestore's shm socket; bulk: its bulk port)")),
      bytes_(common::CounterFamily(r, "hybridserve_worker_direct_put_bytes_total",
                                   "Bytes of the cache entries put by a direct path")),
      fallbacks_(common::CounterFamily(r, "hybridserve_worker_direct_put_fallbacks_total",
                                       "Put calls that went on over gRPC after the direct path failed, by reason")) {}

void DirectPutMetrics::Sync(const cachestore::DirectPutCounts& now) {
  absl::MutexLock lock(&mu_);
  // The reasons' series at 0, once per path (the first Sync names it).
  if (last_.count(now.path) == 0) common::DeclareFailureReasons(fallbacks_, {{"path", now.path}}, "reason");
  cachestore::DirectPutCounts& last = last_[now.path];
  common::AdvanceCounter(entries_.Add({{"path", now.path}}), now.entries, last.entries);
  common::AdvanceCounter(bytes_.Add({{"path", now.path}}), now.bytes, last.bytes);
  common::AdvanceByKey(fallbacks_, {{"path", now.path}}, "reason", now.fallbacks, last.fallbacks);
  last = now;
}

}  // namespace hybridserve::worker
