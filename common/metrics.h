#ifndef HYBRIDSERVE_COMMON_METRICS_H_
#define HYBRIDSERVE_COMMON_METRICS_H_

// Prometheus metrics through prometheus-cpp. A service owns one Registry, builds
// its families on it, and serves it over HTTP with a MetricsExposer.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hybridserve::common {

// Bucket boundaries start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// Serves a registry at http://<bind>/metrics. Thread-safe; stops serving when
// destroyed.
class MetricsExposer {
 public:
  // `bind` is "host:port"; port 0 picks a free port (see port()).
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Create(const std::string& bind,
                                                                std::shared_ptr<prometheus::Registry> registry);

  int port() const;

 private:
  explicit MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer);
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_METRICS_H_
