#include "worker/direct_read_metrics.h"

#include <cstdint>
#include <string>

#include "common/metrics.h"

namespace hybridserve::worker {

DirectReadMetrics::Path DirectReadMetrics::Register(prometheus::Registry& r, const std::string& prefix,
                                                    const std::string& path, const std::string& what) {
  const std::string name = prefix + "_" + path + "_";
  return Path{
      common::UnlabelledCounter(r, name + "reads_total", "Cache reads (Get, GetMany) served " + what),
      common::UnlabelledCounter(r, name + "bytes_total", "Entry bytes read " + what),
      common::CounterFamily(r, name + "fallbacks_total",
                            "Reads " + what + " that failed and went to gRPC instead, by reason (the status code)")};
}

DirectReadMetrics::DirectReadMetrics(prometheus::Registry& r, const std::string& prefix)
    : shm_(Register(r, prefix, "shm", "by shared memory (--cachestore_shm_socket)")),
      bulk_(Register(r, prefix, "bulk", "over the cachestore's bulk port (--cachestore_bulk_address)")) {
  common::DeclareFailureReasons(shm_.fallbacks, {}, "reason");
  common::DeclareFailureReasons(bulk_.fallbacks, {}, "reason");
}

void DirectReadMetrics::Sync(const cachestore::DirectReadCounts& now) {
  absl::MutexLock lock(&mu_);
  Path& m = now.path == "bulk" ? bulk_ : shm_;
  cachestore::DirectReadCounts& last = last_[now.path];
  common::AdvanceCounter(m.reads, now.reads, last.reads);
  common::AdvanceCounter(m.bytes, now.bytes, last.bytes);
  common::AdvanceByKey(m.fallbacks, {}, "reason", now.fallbacks, last.fallbacks);
  last = now;
}

}  // namespace hybridserve::worker
