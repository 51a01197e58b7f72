#include "worker/direct_read_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {
namespace {

// Every sample, by "name" or "name{reason}"; with `zero_reasons` false, the
// reason series still at 0 are left out.
std::map<std::string, double> Samples(prometheus::Registry& registry, bool zero_reasons = false) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      if (!zero_reasons && !m.label.empty() && m.counter.value == 0) continue;
      std::string key = family.name;
      for (const prometheus::ClientMetric::Label& l : m.label) key += "{" + l.value + "}";
      out[key] = m.counter.value;
    }
  }
  return out;
}

// Both fallback families are declared before any failure: one series at 0 per
// status code but OK, on each path.
TEST(DirectReadMetricsTest, FallbackReasonsExistAtZeroFromTheStart) {
  prometheus::Registry registry;
  DirectReadMetrics metrics(registry, "hybridserve_decode_cache");
  const std::map<std::string, double> all = Samples(registry, /*zero_reasons=*/true);
  EXPECT_EQ(all.size(), 4 + 2 * 16);
  EXPECT_EQ(all.at("hybridserve_decode_cache_shm_fallbacks_total{cancelled}"), 0);
  EXPECT_EQ(all.at("hybridserve_decode_cache_shm_fallbacks_total{unauthenticated}"), 0);
  EXPECT_EQ(all.at("hybridserve_decode_cache_bulk_fallbacks_total{unavailable}"), 0);
  EXPECT_EQ(all.count("hybridserve_decode_cache_bulk_fallbacks_total{ok}"), 0);
}

// Both paths' series exist from the start (at 0); each Sync advances the
// path it names to the cumulative counts, and a scrape with nothing new adds
// nothing.
TEST(DirectReadMetricsTest, CountersFollowTheCumulativeCountsOfTheirPath) {
  prometheus::Registry registry;
  DirectReadMetrics metrics(registry, "hybridserve_decode_cache");
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{
                                   {"hybridserve_decode_cache_bulk_bytes_total", 0},
                                   {"hybridserve_decode_cache_bulk_reads_total", 0},
                                   {"hybridserve_decode_cache_shm_bytes_total", 0},
                                   {"hybridserve_decode_cache_shm_reads_total", 0},
                               }));
  cachestore::DirectReadCounts c;
  c.path = "shm";
  c.reads = 4;
  c.bytes = 64 << 20;
  c.fallbacks["data_loss"] = 1;
  metrics.Sync(c);
  metrics.Sync(c);
  c.reads = 6;
  c.bytes += 100;
  c.fallbacks["unavailable"] = 2;
  metrics.Sync(c);
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{
                                   {"hybridserve_decode_cache_bulk_bytes_total", 0},
                                   {"hybridserve_decode_cache_bulk_reads_total", 0},
                                   {"hybridserve_decode_cache_shm_bytes_total", (64 << 20) + 100},
                                   {"hybridserve_decode_cache_shm_fallbacks_total{data_loss}", 1},
                                   {"hybridserve_decode_cache_shm_fallbacks_total{unavailable}", 2},
                                   {"hybridserve_decode_cache_shm_reads_total", 6},
                               }));
}

}  // namespace
}  // namespace hybridserve::worker
