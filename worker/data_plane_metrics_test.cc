#include "worker/data_plane_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hybridserve::worker {
namespace {

// The samples of hybridserve_data_plane_bytes_total, by "path/direction" (plane cuda_ipc).
std::map<std::string, double> Samples(prometheus::Registry& registry) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "hybridserve_data_plane_bytes_total") continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const prometheus::ClientMetric::Label& l : m.label) labels[l.name] = l.value;
      EXPECT_EQ(labels["plane"], "cuda_ipc");
      out[labels["path"] + "/" + labels["direction"]] = m.counter.value;
    }
  }
  return out;
}

TEST(DataPlaneMetricsTest, CountersFollowTheCumulativeTrafficAndStartAtZero) {
  prometheus::Registry registry;
  DataPlaneMetrics metrics(registry);
  const std::map<std::string, double> zero = {
      {"device_copy/received", 0}, {"device_copy/sent", 0}, {"socket/received", 0}, {"socket/sent", 0}};
  EXPECT_EQ(Samples(registry), zero);

  transport::IpcTraffic t;
  t.sent_by_device_copy = 4096 * 12;
  t.sent_by_socket = 700;
  t.received_by_socket = 150;
  metrics.Sync(t);
  metrics.Sync(t);  // a scrape with nothing new adds nothing
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{{"device_copy/received", 0},
                                                              {"device_copy/sent", 4096 * 12},
                                                              {"socket/received", 150},
                                                              {"socket/sent", 700}}));
  t.sent_by_device_copy += 4096;
  t.received_by_device_copy = 10;
  metrics.Sync(t);
  EXPECT_EQ(Samples(registry), (std::map<std::string, double>{{"device_copy/received", 10},
                                                              {"device_copy/sent", 4096 * 13},
                                                              {"socket/received", 150},
                                                              {"socket/sent", 700}}));
}

}  // namespace
}  // namespace hybridserve::worker
