#include "cachestore/server/service_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::cachestore {
namespace {

// The value of hybridserve_cache_evictions_total{class, reason}; -1 when it is not exposed.
double Evictions(prometheus::Registry& registry, const std::string& cls, const std::string& reason) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != "hybridserve_cache_evictions_total") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string c, r;
      for (const prometheus::ClientMetric::Label& l : m.label) (l.name == "class" ? c : r) = l.value;
      if (c == cls && r == reason) return m.counter.value;
    }
  }
  return -1.0;
}

TEST(ServiceMetricsTest, EvictionsToMakeRoomAreCountedUnderTheIndexPolicy) {
  IndexStats stats;
  stats.pages.evicted_lru = 3;
  stats.states.evicted_lru = 2;
  stats.states.evicted_ttl = 1;
  for (const EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kUtility}) {
    const std::string reason = policy == EvictionPolicy::kUtility ? "utility" : "lru";
    const std::string other = policy == EvictionPolicy::kUtility ? "lru" : "utility";
    prometheus::Registry registry;
    ServiceMetrics metrics(registry, policy);
    EXPECT_EQ(Evictions(registry, "page", reason), 0.0) << reason;  // exposed from the start
    metrics.SyncFromStats(stats);
    EXPECT_EQ(Evictions(registry, "page", reason), 3.0) << reason;
    EXPECT_EQ(Evictions(registry, "state", reason), 2.0) << reason;
    EXPECT_EQ(Evictions(registry, "state", "ttl"), 1.0) << reason;
    EXPECT_EQ(Evictions(registry, "page", other), -1.0) << reason;
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
