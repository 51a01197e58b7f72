#include "common/metrics.h"

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::common {

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  out.reserve(count);
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Create(const std::string& bind,
                                                                       std::shared_ptr<prometheus::Registry> registry) {
  // prometheus-cpp reports a failed bind by throwing; this is the one place we
  // let a library exception reach us, and it stops here.
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics exposer cannot bind ", bind, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsExposer>(new MetricsExposer(std::move(exposer)));
}

MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer) : exposer_(std::move(exposer)) {}

int MetricsExposer::port() const {
  std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace hybridserve::common
