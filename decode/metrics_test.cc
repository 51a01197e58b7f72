#include "decode/metrics.h"

#include <string>

#include "absl/time/time.h"
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

// The value of the unlabelled gauge `name`; -1 when it is not exposed.
double GaugeValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name == name && f.metric.size() == 1) return f.metric[0].gauge.value;
  }
  return -1.0;
}

TEST(DecodeMetricsTest, KvPagesFreeAndTotal) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  // The gpu overlay's --max_pages, a quarter of them free: the autoscalers'
  // ratio is 1 - free / total = 0.75 (deploy/k8s/monitoring/rules).
  metrics.SetPageTotal(65536);
  metrics.SetFree(16384, 3);
  EXPECT_EQ(GaugeValue(registry, "hybridserve_kv_pages_total"), 65536.0);
  EXPECT_EQ(GaugeValue(registry, "hybridserve_kv_pages_free"), 16384.0);
  EXPECT_EQ(GaugeValue(registry, "hybridserve_state_slots_free"), 3.0);
  metrics.SetFree(65536, 8);  // idle: the total stays
  EXPECT_EQ(GaugeValue(registry, "hybridserve_kv_pages_total"), 65536.0);
  EXPECT_EQ(GaugeValue(registry, "hybridserve_kv_pages_free"), 65536.0);
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

TEST(DecodeMetricsTest, HistoryReadAndLocalPrefillCountersFollowTheLoopsTotals) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  const std::string names[] = {
      "hybridserve_decode_history_reads_total",
      "hybridserve_decode_history_pages_total",
      "hybridserve_decode_history_read_failures_total",
      "hybridserve_decode_local_prefills_total",
      "hybridserve_decode_local_prefill_failures_total",
      "hybridserve_decode_local_prefill_resume_seconds_total",
      "hybridserve_decode_local_prefill_compute_seconds_total",
      "hybridserve_decode_local_prefill_computed_tokens_total",
  };
  for (const std::string& name : names) EXPECT_EQ(CounterValue(registry, name), 0.0) << name;
  metrics.SyncHistoryReads(1, 64, 2);
  metrics.SyncLocalPrefills(3, 1, 90, absl::Milliseconds(250), absl::Seconds(2));
  metrics.SyncLocalPrefills(3, 1, 90, absl::Milliseconds(250), absl::Seconds(2));  // a scrape with nothing new
  metrics.SyncHistoryReads(1, 64, 2);
  const double after_one[] = {1, 64, 2, 3, 1, 0.25, 2, 90};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(CounterValue(registry, names[i]), after_one[i]) << names[i];
  metrics.SyncHistoryReads(2, 100, 2);
  metrics.SyncLocalPrefills(7, 4, 200, absl::Milliseconds(750), absl::Seconds(3));
  const double after_two[] = {2, 100, 2, 7, 4, 0.75, 3, 200};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(CounterValue(registry, names[i]), after_two[i]) << names[i];
}

// The value of `name`'s counter labelled reason=`reason`; -1 when it is not
// exposed.
double ReasonValue(prometheus::Registry& registry, const std::string& name, const std::string& reason) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "reason" && l.value == reason) return m.counter.value;
      }
    }
  }
  return -1.0;
}

TEST(DecodeMetricsTest, FallbackPrefillCountersFollowTheLoopsTotalsByReason) {
  prometheus::Registry registry;
  DecodeMetrics metrics(registry);
  const std::string fallbacks = "hybridserve_decode_fallback_prefills_total";
  const std::string failures = "hybridserve_decode_fallback_prefill_failures_total";
  // Both reasons exposed from the start, at 0.
  EXPECT_EQ(ReasonValue(registry, fallbacks, "unavailable"), 0.0);
  EXPECT_EQ(ReasonValue(registry, fallbacks, "failed"), 0.0);
  EXPECT_EQ(CounterValue(registry, failures), 0.0);
  metrics.SyncFallbackPrefills(4, 1, 2);
  metrics.SyncFallbackPrefills(4, 1, 2);  // a scrape with nothing new
  EXPECT_EQ(ReasonValue(registry, fallbacks, "unavailable"), 4.0);
  EXPECT_EQ(ReasonValue(registry, fallbacks, "failed"), 1.0);
  EXPECT_EQ(CounterValue(registry, failures), 2.0);
  metrics.SyncFallbackPrefills(5, 3, 2);
  EXPECT_EQ(ReasonValue(registry, fallbacks, "unavailable"), 5.0);
  EXPECT_EQ(ReasonValue(registry, fallbacks, "failed"), 3.0);
  EXPECT_EQ(CounterValue(registry, failures), 2.0);
}

}  // namespace
}  // namespace hybridserve::decode
