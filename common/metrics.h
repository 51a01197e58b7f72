#ifndef HYBRIDSERVE_COMMON_METRICS_H_
#define HYBRIDSERVE_COMMON_METRICS_H_

// Prometheus metrics through prometheus-cpp. A service owns one Registry, builds
// its families on it, and serves it over HTTP with a MetricsExposer.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

struct MHD_Daemon;

namespace hybridserve::common {

// ---- Building a service's metrics (decode/metrics.h, prefill/metrics.h,
// cachestore/server/service_metrics.h, worker/*_metrics.h) ----

// A family `name` described by `help`, registered in `registry` (which owns
// it and must outlive every use). prometheus-cpp aborts on a name registered
// twice in one registry with another type or help.
prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry, const std::string& name,
                                                       const std::string& help);
prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry, const std::string& name,
                                                   const std::string& help);

// The one series, without labels, of a family registered as above.
prometheus::Counter& UnlabelledCounter(prometheus::Registry& registry, const std::string& name,
                                       const std::string& help);
prometheus::Gauge& UnlabelledGauge(prometheus::Registry& registry, const std::string& name, const std::string& help);
prometheus::Histogram& UnlabelledHistogram(prometheus::Registry& registry, const std::string& name,
                                           const std::string& help, std::vector<double> buckets);

// Bucket boundaries start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// For a count kept cumulatively elsewhere (a worker's counters, the index's
// statistics) and copied into `counter` before each scrape: advances it by
// what the count gained, `now` - `last`; nothing when it did not grow.
void AdvanceCounter(prometheus::Counter& counter, double now, double last);

// The same for counts kept cumulatively by a key (a failure reason, say):
// advances the counter of `family` labelled `labels` plus {label: key} by
// what each key of `now` gained since `last`.
void AdvanceByKey(prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
                  const std::string& label, const std::map<std::string, int64_t>& now,
                  const std::map<std::string, int64_t>& last);

// Creates the series of `family` labelled `labels` plus {label: reason} at 0
// for every reason FailureReason() gives a failed status (each absl status code
// but OK, "unavailable", "data_loss", ...), so a scrape declares the family and
// reads 0 for a reason before the first failure of it. Reasons counted that are
// no status code (decode's "export") still appear with their first count.
void DeclareFailureReasons(prometheus::Family<prometheus::Counter>& family, const prometheus::Labels& labels,
                           const std::string& label);

// Serves a registry at http://<bind>/metrics in the Prometheus text format
// (version 0.0.4): GET or HEAD /metrics is answered 200 with the registry as
// collected at that request, any other path 404, any other method 405.
// Thread-safe; stops serving, and closes every connection, when destroyed.
//
// Idle or slow clients cannot starve a scrape: one event loop (libmicrohttpd
// with epoll, on one internal thread) serves every connection, so a client that
// connects and sends nothing, or sends its request a byte at a time, holds no
// thread and delays no one. (prometheus-cpp's own Exposer, civetweb, gives each
// connection one of a few worker threads until its request arrives; two idle
// clients delayed scrapes by 30 s.) What such clients can still take:
//   - a connection slot each: at most kMaxConnections connections are open at
//     once; beyond that, new connections wait in the kernel's listen backlog
//     until a slot frees;
//   - only for kConnectionTimeout when silent: a connection with no traffic for
//     that long is closed (a client still trickling bytes keeps its slot, but
//     its request is capped by libmicrohttpd's 32 KiB per-connection memory).
class MetricsExposer {
 public:
  static constexpr int kMaxConnections = 1024;
  static constexpr absl::Duration kConnectionTimeout = absl::Seconds(5);

  // `bind` is "host:port" with a numeric IPv4 host ("0.0.0.0", "127.0.0.1") or
  // a bracketed numeric IPv6 host ("[::1]:9100"); port 0 picks a free port (see
  // port()). The socket is bound with SO_REUSEADDR and never SO_REUSEPORT, so a
  // port in use is refused. Errors name `bind`: INVALID_ARGUMENT for an address
  // that does not parse, UNAVAILABLE for one that cannot be bound or served.
  // `before_scrape` (optional) runs on the daemon's thread before each
  // scrape collects the registry: it brings metrics kept elsewhere (a
  // worker's cumulative counters) up to date. It must outlive the exposer
  // and be thread-safe.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Create(const std::string& bind,
                                                                std::shared_ptr<prometheus::Registry> registry,
                                                                std::function<void()> before_scrape = nullptr);

  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;
  ~MetricsExposer();

  // The port being served (the one picked when `bind` asked for port 0).
  int port() const { return port_; }

 private:
  MetricsExposer(std::shared_ptr<prometheus::Registry> registry, std::function<void()> before_scrape, int port)
      : registry_(std::move(registry)), before_scrape_(std::move(before_scrape)), port_(port) {}
  friend struct MetricsExposerAccess;

  // Read by the daemon's thread at every scrape; outlive daemon_.
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> before_scrape_;
  MHD_Daemon* daemon_ = nullptr;  // owned; stopped in the destructor
  int port_ = 0;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_METRICS_H_
