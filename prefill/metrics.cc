#include "prefill/metrics.h"

#include <string>

#include "common/metrics.h"

namespace hybridserve::prefill {
namespace {

using common::AdvanceCounter;
using common::CounterFamily;
using common::UnlabelledCounter;
using common::UnlabelledGauge;

// Buckets start, 2*start, ... (count of them).
prometheus::Histogram& Histogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                                 double start, int count) {
  return common::UnlabelledHistogram(r, name, help, common::ExponentialBuckets(start, 2.0, count));
}

}  // namespace

PrefillMetrics::PrefillMetrics(prometheus::Registry& r)
    : queue_(UnlabelledGauge(r, "hybridserve_prefill_queue_depth",
                             "Prefill requests admitted and not finished (running or waiting for the engine)")),
      requests_(CounterFamily(r, "hybridserve_prefill_requests_total", "Prefill calls by outcome")),
      ok_(requests_.Add({{"outcome", "ok"}})),
      failed_(requests_.Add({{"outcome", "failed"}})),
      refused_(requests_.Add({{"outcome", "refused"}})),
      cancelled_(requests_.Add({{"outcome", "cancelled"}})),
      transfers_in_flight_(UnlabelledGauge(r, "hybridserve_prefill_transfers_in_flight",
                                           "Pushes of a state to a decode worker under way")),
      publications_in_flight_(UnlabelledGauge(r, "hybridserve_prefill_publications_in_flight",
                                              "Cache publications queued or being put, behind the answers")),
      transfer_failures_(
          UnlabelledCounter(r, "hybridserve_prefill_transfer_failures_total",
                            "Pushes of a state to a decode worker that failed (peer gone, refused, timed out)")),
      free_pages_(UnlabelledGauge(r, "hybridserve_prefill_kv_pages_free",
                                  "KV pages of the prefill engine not held by a sequence (all of them when idle)")),
      free_slots_(UnlabelledGauge(r, "hybridserve_prefill_state_slots_free",
                                  "State slots of the prefill engine not held by a sequence (all of them when idle)")),
      prompt_tokens_(
          UnlabelledCounter(r, "hybridserve_prefill_prompt_tokens_total", "Prompt tokens of successful prefills")),
      prefilled_tokens_(UnlabelledCounter(r, "hybridserve_prefill_computed_tokens_total",
                                          "Prompt tokens actually prefilled (prompt minus what came from the cache)")),
      cache_queries_(UnlabelledCounter(r, "hybridserve_prefix_cache_queries_total",
                                       "Prompt tokens looked up in the cache (vLLM prefix_cache_queries)")),
      cache_hits_(UnlabelledCounter(r, "hybridserve_prefix_cache_hits_total",
                                    "Prompt tokens whose state came from the cache (vLLM prefix_cache_hits)")),
      recomputed_(
          UnlabelledCounter(r, "hybridserve_prefill_recomputed_tokens_total",
                            "Tokens with cached KV pages prefilled again for want of an SSM state at a deeper point")),
      resume_depth_(Histogram(r, "hybridserve_prefill_resume_depth_tokens",
                              "Position prefill resumed from (0 when cold)", 16, 16)),
      kv_match_depth_(Histogram(r, "hybridserve_prefill_kv_match_depth_tokens",
                                "Tokens of the prompt whose KV pages the cache held", 16, 16)),
      seconds_(Histogram(r, "hybridserve_prefill_seconds", "Prefill call time, push included", 0.001, 17)),
      transfer_bytes_(UnlabelledCounter(r, "hybridserve_transfer_bytes_total", "Bytes pushed to decode workers")),
      transfer_seconds_(
          Histogram(r, "hybridserve_transfer_seconds", "Time of one push to a decode worker", 0.0001, 18)),
      resume_seconds_(Histogram(r, "hybridserve_prefill_resume_seconds",
                                "Cache lookup, fetch and restore of one prefill call (0 without a cache)", 0.0001, 18)),
      compute_seconds_(Histogram(r, "hybridserve_prefill_compute_seconds",
                                 "Engine prefill past the resume point and first-token sampling of one call", 0.001,
                                 17)),
      lookups_(
          UnlabelledCounter(r, "hybridserve_prefill_cache_lookups_total", "Resume-point lookups in the cachestore")),
      errors_as_misses_(UnlabelledCounter(r, "hybridserve_prefill_cache_errors_total",
                                          "Cachestore calls or entries that failed and were treated as misses")),
      pages_published_(UnlabelledCounter(r, "hybridserve_prefill_pages_published_total", "KV pages published")),
      states_published_(UnlabelledCounter(r, "hybridserve_prefill_states_published_total",
                                          "Grid checkpoints and prompt-end snapshots published")),
      publish_failures_(CounterFamily(r, "hybridserve_prefill_publish_failures_total",
                                      "Cache puts of pages and states that failed, by reason (the status code)")) {
  common::DeclareFailureReasons(publish_failures_, {}, "reason");
}

void PrefillMetrics::SetQueueDepth(int64_t outstanding) { queue_.Set(static_cast<double>(outstanding)); }
void PrefillMetrics::RecordFailure() { failed_.Increment(); }
void PrefillMetrics::RecordRefused() { refused_.Increment(); }
void PrefillMetrics::RecordCancelled() { cancelled_.Increment(); }
void PrefillMetrics::SetFree(int64_t pages, int64_t slots) {
  free_pages_.Set(static_cast<double>(pages));
  free_slots_.Set(static_cast<double>(slots));
}

void PrefillMetrics::RecordSuccess(const PrefillOutcome& o, double seconds) {
  ok_.Increment();
  seconds_.Observe(seconds);
  prompt_tokens_.Increment(static_cast<double>(o.usage.prompt_tokens));
  prefilled_tokens_.Increment(static_cast<double>(o.usage.prompt_tokens - o.usage.cached_tokens));
  cache_queries_.Increment(static_cast<double>(o.usage.prompt_tokens));
  cache_hits_.Increment(static_cast<double>(o.usage.cached_tokens));
  recomputed_.Increment(static_cast<double>(o.usage.recomputed_tokens));
  resume_depth_.Observe(static_cast<double>(o.usage.cached_tokens));
  kv_match_depth_.Observe(static_cast<double>(o.usage.kv_match_tokens));
  transfer_bytes_.Increment(static_cast<double>(o.transfer_bytes));
  transfer_seconds_.Observe(absl::ToDoubleSeconds(o.transfer_time));
  resume_seconds_.Observe(absl::ToDoubleSeconds(o.resume_time));
  compute_seconds_.Observe(absl::ToDoubleSeconds(o.compute_time));
}

void PrefillMetrics::SyncCounters(const PrefillCacheCounters& now) {
  absl::MutexLock lock(&mu_);
  AdvanceCounter(lookups_, now.lookups, last_.lookups);
  AdvanceCounter(errors_as_misses_, now.errors_as_misses, last_.errors_as_misses);
  AdvanceCounter(pages_published_, now.pages_published, last_.pages_published);
  AdvanceCounter(states_published_, now.states_published, last_.states_published);
  transfers_in_flight_.Set(static_cast<double>(now.transfers_in_flight));
  publications_in_flight_.Set(static_cast<double>(now.publications_in_flight));
  AdvanceCounter(transfer_failures_, now.transfer_failures, last_.transfer_failures);
  common::AdvanceByKey(publish_failures_, {}, "reason", now.publish_failures_by_reason,
                       last_.publish_failures_by_reason);
  last_ = now;
}

}  // namespace hybridserve::prefill
