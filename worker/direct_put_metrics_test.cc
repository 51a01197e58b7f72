#include "worker/direct_put_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {
namespace {

// Every sample of the three families, by "name{path[,reason]}"; with
// `zero_reasons` false, the reason series still at 0 are left out.
std::map<std::string, double> Samples(prometheus::Registry& registry, bool zero_reasons = false) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      std::string key = family.name + "{" + labels["path"];
      if (labels.count("reason") != 0) key += "," + labels["reason"];
      if (!zero_reasons && labels.count("reason") != 0 && m.counter.value == 0) continue;
      out[key + "}"] = m.counter.value;
    }
  }
  return out;
}

TEST(DirectPutMetricsTest, CountersFollowTheCumulativeCountsOfTheirPath) {
  prometheus::Registry registry;
  DirectPutMetrics metrics(registry);
  cachestore::DirectPutCounts c;
  c.path = "bulk";
  c.entries = 66;
  c.bytes = 20 << 20;
  c.fallbacks["unavailable"] = 1;
  metrics.Sync(c);
  // The first Sync of a path declares its fallbacks: each reason at 0.
  const std::map<std::string, double> all = Samples(registry, /*zero_reasons=*/true);
  EXPECT_EQ(all.size(), 2 + 16);
  EXPECT_EQ(all.at("hybridserve_worker_direct_put_fallbacks_total{bulk,data_loss}"), 0);
  EXPECT_EQ(all.at("hybridserve_worker_direct_put_fallbacks_total{bulk,unauthenticated}"), 0);
  metrics.Sync(c);  // a scrape with nothing new adds nothing
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{
                                   {"hybridserve_worker_direct_put_bytes_total{bulk}", 20 << 20},
                                   {"hybridserve_worker_direct_put_entries_total{bulk}", 66},
                                   {"hybridserve_worker_direct_put_fallbacks_total{bulk,unavailable}", 1},
                               }));
  c.entries += 3;
  c.bytes += 100;
  c.fallbacks["unavailable"] = 2;
  c.fallbacks["invalid_argument"] = 1;
  metrics.Sync(c);
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{
                                   {"hybridserve_worker_direct_put_bytes_total{bulk}", (20 << 20) + 100},
                                   {"hybridserve_worker_direct_put_entries_total{bulk}", 69},
                                   {"hybridserve_worker_direct_put_fallbacks_total{bulk,invalid_argument}", 1},
                                   {"hybridserve_worker_direct_put_fallbacks_total{bulk,unavailable}", 2},
                               }));
}

}  // namespace
}  // namespace hybridserve::worker
