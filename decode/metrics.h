#ifndef HYBRIDSERVE_DECODE_METRICS_H_
#define HYBRIDSERVE_DECODE_METRICS_H_

// The decode worker's Prometheus metrics (docs/ARCHITECTURE.md section 6), named after
// vLLM's where one means the same (vllm:num_requests_running ->
// hybridserve_num_requests_running, and so on). Thread-safe (prometheus-cpp
// metrics are).

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "decode/generation.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hybridserve::decode {

class DecodeMetrics {
 public:
  explicit DecodeMetrics(prometheus::Registry& registry);

  void SetQueue(int64_t waiting, int64_t running);
  void SetFree(int64_t pages, int64_t slots);
  // The engine's KV page total (--max_pages), set once at start: the
  // denominator of the autoscalers' page-use ratio, whatever the overlay sizes.
  void SetPageTotal(int64_t pages);
  // The largest decode batch so far, and prefill calls still running for
  // requests that ended (DecodeLoop::Counts).
  void SetBatchPeak(int64_t peak);
  void SetOrphanedCalls(int64_t calls);
  void RecordFirstToken(double seconds_since_arrival);
  void RecordInterToken(double seconds);
  // At the end of a request (also one refused before it started: `started` false).
  void RecordFinish(const Completion& completion, double e2e_seconds);
  void RecordRefused();
  // Brings the data plane's counters up to the receiver's totals since start
  // (StateReceiver::refused, unauthenticated); called by each scrape.
  void SyncDataPlane(int64_t refused, int64_t unauthenticated) ABSL_LOCKS_EXCLUDED(mu_);
  // Brings the counters of prompts' pages read from the cache up to the
  // loop's totals (DecodeLoop::Counts history_*); called by each scrape.
  void SyncHistoryReads(int64_t reads, int64_t pages, int64_t failures) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for the requests prefilled in this worker (DecodeLoop::Counts
  // local_prefill*).
  void SyncLocalPrefills(int64_t prefills, int64_t failures, int64_t computed_tokens, absl::Duration resume,
                         absl::Duration compute) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for the requests prefilled here after their prefill call
  // failed (DecodeLoop::Counts fallback_*): by reason "unavailable" (no
  // prefill worker answered) or "failed" (the call or its transfer failed
  // otherwise), and those fallbacks that failed too.
  void SyncFallbackPrefills(int64_t unavailable, int64_t failed, int64_t failures) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Gauge& waiting_;
  prometheus::Gauge& running_;
  prometheus::Gauge& free_pages_;
  prometheus::Gauge& total_pages_;
  prometheus::Gauge& free_slots_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& e2e_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& cached_tokens_;
  prometheus::Counter& recomputed_tokens_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Counter& finished_stop_;
  prometheus::Counter& finished_length_;
  prometheus::Counter& finished_abort_;
  prometheus::Counter& finished_error_;
  prometheus::Counter& refused_;
  prometheus::Family<prometheus::Counter>& resume_;
  prometheus::Counter& resume_cold_;
  prometheus::Counter& resume_grid_;
  prometheus::Counter& resume_exact_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Gauge& batch_peak_;
  prometheus::Gauge& orphaned_calls_;
  prometheus::Histogram& publish_wait_;
  prometheus::Counter& states_published_;
  prometheus::Counter& pages_published_;
  prometheus::Family<prometheus::Counter>& publish_failures_;
  prometheus::Counter& parent_waits_expired_;
  prometheus::Counter& data_plane_refused_;
  prometheus::Counter& data_plane_unauthenticated_;
  prometheus::Counter& history_reads_;
  prometheus::Counter& history_pages_;
  prometheus::Counter& history_failures_;
  prometheus::Counter& local_prefills_;
  prometheus::Counter& local_prefill_failures_;
  prometheus::Counter& local_prefill_tokens_;
  prometheus::Counter& local_prefill_resume_seconds_;
  prometheus::Counter& local_prefill_compute_seconds_;
  prometheus::Family<prometheus::Counter>& fallback_prefills_;
  prometheus::Counter& fallback_unavailable_;
  prometheus::Counter& fallback_failed_;
  prometheus::Counter& fallback_failures_;
  absl::Mutex mu_;
  int64_t last_history_reads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_history_pages_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_history_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_local_prefills_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_local_prefill_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_local_prefill_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration last_local_prefill_resume_ ABSL_GUARDED_BY(mu_);
  absl::Duration last_local_prefill_compute_ ABSL_GUARDED_BY(mu_);
  int64_t last_fallback_unavailable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_fallback_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_fallback_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_data_plane_refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_data_plane_unauthenticated_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_METRICS_H_
