#ifndef HYBRIDSERVE_PREFILL_METRICS_H_
#define HYBRIDSERVE_PREFILL_METRICS_H_

// The prefill worker's Prometheus metrics (docs/ARCHITECTURE.md section 6), named after
// vLLM's where one means the same. Thread-safe (prometheus-cpp metrics are;
// SyncCounters serializes on its own mutex).

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prefill/prefill_worker.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hybridserve::prefill {

class PrefillMetrics {
 public:
  explicit PrefillMetrics(prometheus::Registry& registry);

  void SetQueueDepth(int64_t outstanding);
  void RecordSuccess(const PrefillOutcome& outcome, double seconds);
  void RecordFailure();
  void RecordRefused();
  // A call whose caller cancelled it (queued or running).
  void RecordCancelled();
  // The engine's free KV pages and state slots (idle: all of them).
  void SetFree(int64_t pages, int64_t slots);
  // Advances the cache counters the worker keeps (cumulative) to `now`.
  void SyncCounters(const PrefillCacheCounters& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Gauge& queue_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& ok_;
  prometheus::Counter& failed_;
  prometheus::Counter& refused_;
  prometheus::Counter& cancelled_;
  prometheus::Gauge& transfers_in_flight_;
  prometheus::Gauge& publications_in_flight_;
  prometheus::Counter& transfer_failures_;
  prometheus::Gauge& free_pages_;
  prometheus::Gauge& free_slots_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& prefilled_tokens_;
  prometheus::Counter& cache_queries_;
  prometheus::Counter& cache_hits_;
  prometheus::Counter& recomputed_;
  prometheus::Histogram& resume_depth_;
  prometheus::Histogram& kv_match_depth_;
  prometheus::Histogram& seconds_;
  prometheus::Counter& transfer_bytes_;
  prometheus::Histogram& transfer_seconds_;
  prometheus::Histogram& resume_seconds_;
  prometheus::Histogram& compute_seconds_;
  prometheus::Counter& lookups_;
  prometheus::Counter& errors_as_misses_;
  prometheus::Counter& pages_published_;
  prometheus::Counter& states_published_;
  prometheus::Family<prometheus::Counter>& publish_failures_;
  absl::Mutex mu_;
  PrefillCacheCounters last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_METRICS_H_
