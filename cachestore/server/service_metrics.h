#ifndef HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_METRICS_H_
#define HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_METRICS_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/index/eviction_utility.h"
#include "cachestore/types.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hybridserve::cachestore {

struct Families;  // service_metrics.cc: the metric families, each registered once

// The cachestore's Prometheus metrics. Thread-safe: prometheus-cpp metrics are,
// and SyncFromStats serializes on its own mutex.
class ServiceMetrics {
 public:
  // Evictions that make room are counted under the reason that names the
  // index's policy: "lru" or "utility".
  explicit ServiceMetrics(prometheus::Registry& registry, EvictionPolicy policy = EvictionPolicy::kLru);

  void RecordLookup(const LookupResult& r, bool hit);
  void RecordPut(bool ok, int64_t bytes, double seconds);
  void RecordGet(bool ok, int64_t bytes, double seconds);
  // A read on the shared-memory socket (shm_server.h); `refused_peer`:
  // a connection refused by its credentials.
  void RecordShmRead(bool ok, bool refused_peer, int64_t bytes);
  // An entry put on the shared-memory socket: counted as a put (RecordPut)
  // and by the socket's own counters.
  void RecordShmPut(bool ok, int64_t bytes, double seconds);
  // A read on the bulk port (bulk_server.h).
  void RecordBulkRead(bool ok, int64_t bytes);
  // An entry put on the bulk port: counted as a put (RecordPut) and by the
  // port's own counters.
  void RecordBulkPut(bool ok, int64_t bytes, double seconds);
  // A call refused by --max_streams or --max_streams_per_peer.
  void RecordRefusedCall();

  // Copies gauges and advances counters that the index keeps (bytes by class,
  // evictions by reason, checksum failures, expiries) and the disk tier's
  // (hybridserve_cache_disk_*).
  void SyncFromStats(const IndexStats& stats) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ServiceMetrics(prometheus::Registry& registry, const Families& families, EvictionPolicy policy);

  prometheus::Counter& lookups_;
  prometheus::Counter& hits_grid_;
  prometheus::Counter& hits_exact_;
  prometheus::Histogram& resume_depth_;
  prometheus::Histogram& kv_match_depth_;
  prometheus::Counter& puts_ok_;
  prometheus::Counter& puts_failed_;
  prometheus::Counter& put_bytes_;
  prometheus::Histogram& put_seconds_;
  prometheus::Counter& gets_ok_;
  prometheus::Counter& gets_failed_;
  prometheus::Counter& get_bytes_;
  prometheus::Histogram& get_seconds_;
  prometheus::Counter& shm_reads_ok_;
  prometheus::Counter& shm_reads_failed_;
  prometheus::Counter& shm_peers_refused_;
  prometheus::Counter& shm_bytes_;
  prometheus::Counter& shm_puts_ok_;
  prometheus::Counter& shm_puts_failed_;
  prometheus::Counter& shm_put_bytes_;
  prometheus::Counter& bulk_reads_ok_;
  prometheus::Counter& bulk_reads_failed_;
  prometheus::Counter& bulk_bytes_;
  prometheus::Counter& bulk_puts_ok_;
  prometheus::Counter& bulk_puts_failed_;
  prometheus::Counter& bulk_put_bytes_;
  prometheus::Counter& calls_refused_;
  prometheus::Gauge& page_resident_;
  prometheus::Gauge& page_reserved_;
  prometheus::Gauge& state_resident_;
  prometheus::Gauge& state_reserved_;
  prometheus::Gauge& page_metadata_;  // index memory counted in the budget
  prometheus::Gauge& state_metadata_;
  prometheus::Gauge& leases_;
  prometheus::Gauge& namespaces_registered_;
  prometheus::Gauge& namespaces_fallback_;
  prometheus::Counter& page_evicted_lru_;
  prometheus::Counter& page_evicted_ttl_;
  prometheus::Counter& state_evicted_lru_;
  prometheus::Counter& state_evicted_ttl_;
  prometheus::Counter& state_dropped_with_pages_;
  prometheus::Counter& checksum_failures_;
  prometheus::Counter& expired_leases_;
  prometheus::Counter& expired_puts_;
  // The disk tier (IndexStats::disk); zeros without one.
  prometheus::Gauge& disk_resident_;
  prometheus::Gauge& disk_budget_;
  prometheus::Gauge& disk_queued_;
  prometheus::Gauge& disk_entries_;
  prometheus::Counter& disk_writes_ok_;
  prometheus::Counter& disk_writes_dropped_;
  prometheus::Counter& disk_writes_failed_;
  prometheus::Counter& disk_reads_ok_;
  prometheus::Counter& disk_reads_failed_;
  prometheus::Counter& disk_promoted_;
  prometheus::Counter& disk_promoted_bytes_;
  prometheus::Counter& disk_evictions_;
  prometheus::Counter& disk_shutdown_spilled_;

  absl::Mutex mu_;
  IndexStats last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SERVER_SERVICE_METRICS_H_
