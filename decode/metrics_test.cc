#include "decode/metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::decode {
namespace {

// The value of the unlabelled counter `name`; -1 when it is not exposed.
double CounterValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name == name && f.metric.size() == 1) return f.metric[0].counter.value;
  }
  return -1.0;
}

TEST(DecodeMetricsTest, DataPlaneCountersFollowTheReceiversTotals) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  const std::string refused = "hybridserve_decode_data_plane_refused_total";
  const std::string unauthenticated = "hybridserve_decode_data_plane_unauthenticated_total";
  // Exposed from the start, at 0: an alert on its rate needs the series.
  EXPECT_EQ(CounterValue(registry, refused), 0.0);
  EXPECT_EQ(CounterValue(registry, unauthenticated), 0.0);
  metrics.SyncDataPlane(2, 5);
  EXPECT_EQ(CounterValue(registry, refused), 2.0);
  EXPECT_EQ(CounterValue(registry, unauthenticated), 5.0);
  metrics.SyncDataPlane(2, 5);  // a scrape with nothing new
  EXPECT_EQ(CounterValue(registry, refused), 2.0);
  EXPECT_EQ(CounterValue(registry, unauthenticated), 5.0);
  metrics.SyncDataPlane(3, 9);
  EXPECT_EQ(CounterValue(registry, refused), 3.0);
  EXPECT_EQ(CounterValue(registry, unauthenticated), 9.0);
}

}  // namespace
}  // namespace hybridserve::decode
