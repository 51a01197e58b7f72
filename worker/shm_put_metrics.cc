#include "worker/shm_put_metrics.h"

#include <cstdint>
#include <string>

namespace hybridserve::worker {

ShmPutMetrics::ShmPutMetrics(prometheus::Registry& r)
    : entries_(prometheus::BuildCounter()
                   .Name("hybridserve_worker_shm_put_entries_total")
                   .Help("Cache entries put by shared memory (answered by the cachestore's shm socket)")
                   .Register(r)
                   .Add({})),
      bytes_(prometheus::BuildCounter()
                 .Name("hybridserve_worker_shm_put_bytes_total")
                 .Help("Bytes of the cache entries put by shared memory")
                 .Register(r)
                 .Add({})),
      fallbacks_(prometheus::BuildCounter()
                     .Name("hybridserve_worker_shm_put_fallbacks_total")
                     .Help("Put calls that went on over gRPC after the shm socket failed, by reason")
                     .Register(r)) {}

void ShmPutMetrics::Sync(const cachestore::ShmPutCounts& now) {
  absl::MutexLock lock(&mu_);
  entries_.Increment(static_cast<double>(now.entries - last_.entries));
  bytes_.Increment(static_cast<double>(now.bytes - last_.bytes));
  for (const auto& [reason, n] : now.fallbacks) {
    auto before = last_.fallbacks.find(reason);
    const int64_t delta = n - (before == last_.fallbacks.end() ? 0 : before->second);
    fallbacks_.Add({{"reason", reason}}).Increment(static_cast<double>(delta));
  }
  last_ = now;
}

}  // namespace hybridserve::worker
