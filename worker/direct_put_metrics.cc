#include "worker/direct_put_metrics.h"

#include <cstdint>
#include <string>

#include "common/metrics.h"

namespace hybridserve::worker {

DirectPutMetrics::DirectPutMetrics(prometheus::Registry& r)
    : entries_(prometheus::BuildCounter()
                   .Name("hybridserve_worker_direct_put_entries_total")
                   .Help("Cache entries put by a direct path (shm: the cachestore's shm socket; bulk: its bulk port)")
                   .Register(r)),
      bytes_(prometheus::BuildCounter()
                 .Name("hybridserve_worker_direct_put_bytes_total")
                 .Help("Bytes of the cache entries put by a direct path")
                 .Register(r)),
      fallbacks_(prometheus::BuildCounter()
                     .Name("hybridserve_worker_direct_put_fallbacks_total")
                     .Help("Put calls that went on over gRPC after the direct path failed, by reason")
                     .Register(r)) {}

void DirectPutMetrics::Sync(const cachestore::DirectPutCounts& now) {
  absl::MutexLock lock(&mu_);
  entries_.Add({{"path", now.path}}).Increment(static_cast<double>(now.entries - last_.entries));
  bytes_.Add({{"path", now.path}}).Increment(static_cast<double>(now.bytes - last_.bytes));
  common::AdvanceByKey(fallbacks_, {{"path", now.path}}, "reason", now.fallbacks, last_.fallbacks);
  last_ = now;
}

}  // namespace hybridserve::worker
