#include "cachestore/service_metrics.h"

#include "common/metrics.h"

namespace hybridserve::cachestore {
namespace {

prometheus::Counter& MakeCounter(prometheus::Registry& r, const std::string& name, const std::string& help,
                                 const std::map<std::string, std::string>& labels = {}) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Gauge& MakeGauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                             const std::map<std::string, std::string>& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Histogram& MakeHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                                     std::vector<double> buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

void Advance(prometheus::Counter& c, int64_t now, int64_t before) {
  if (now > before) c.Increment(static_cast<double>(now - before));
}

}  // namespace

ServiceMetrics::ServiceMetrics(prometheus::Registry& r)
    : lookups_(MakeCounter(r, "hybridserve_cache_lookups_total", "Prefix-cache lookups.")),
      hits_grid_(prometheus::BuildCounter()
                     .Name("hybridserve_cache_hits_total")
                     .Help("Lookups that found a resume point, by state kind.")
                     .Register(r)
                     .Add({{"kind", "grid_checkpoint"}})),
      hits_exact_(prometheus::BuildCounter()
                      .Name("hybridserve_cache_hits_total")
                      .Help("Lookups that found a resume point, by state kind.")
                      .Register(r)
                      .Add({{"kind", "exact_prefix"}})),
      resume_depth_(MakeHistogram(r, "hybridserve_cache_resume_depth_tokens", "Resume point of lookups, tokens.",
                                  common::ExponentialBuckets(16, 2, 14))),
      kv_match_depth_(MakeHistogram(r, "hybridserve_cache_kv_match_depth_tokens",
                                    "Tokens covered by matched KV pages, tokens.",
                                    common::ExponentialBuckets(16, 2, 14))),
      puts_ok_(MakeCounter(r, "hybridserve_cache_puts_total", "Put streams by outcome.", {{"outcome", "ok"}})),
      puts_failed_(prometheus::BuildCounter()
                       .Name("hybridserve_cache_puts_total")
                       .Help("Put streams by outcome.")
                       .Register(r)
                       .Add({{"outcome", "error"}})),
      put_bytes_(MakeCounter(r, "hybridserve_cache_put_bytes_total", "Bytes committed by puts.")),
      put_seconds_(MakeHistogram(r, "hybridserve_cache_put_seconds", "Duration of put streams.",
                                 common::ExponentialBuckets(1e-4, 2, 18))),
      gets_ok_(MakeCounter(r, "hybridserve_cache_gets_total", "Get streams by outcome.", {{"outcome", "ok"}})),
      gets_failed_(prometheus::BuildCounter()
                       .Name("hybridserve_cache_gets_total")
                       .Help("Get streams by outcome.")
                       .Register(r)
                       .Add({{"outcome", "error"}})),
      get_bytes_(MakeCounter(r, "hybridserve_cache_get_bytes_total", "Bytes served by gets.")),
      get_seconds_(MakeHistogram(r, "hybridserve_cache_get_seconds", "Duration of get streams.",
                                 common::ExponentialBuckets(1e-4, 2, 18))),
      page_resident_(MakeGauge(r, "hybridserve_cache_bytes", "Cache bytes by class and state.",
                               {{"class", "page"}, {"state", "resident"}})),
      page_reserved_(prometheus::BuildGauge()
                         .Name("hybridserve_cache_bytes")
                         .Help("Cache bytes by class and state.")
                         .Register(r)
                         .Add({{"class", "page"}, {"state", "reserved"}})),
      state_resident_(prometheus::BuildGauge()
                          .Name("hybridserve_cache_bytes")
                          .Help("Cache bytes by class and state.")
                          .Register(r)
                          .Add({{"class", "state"}, {"state", "resident"}})),
      state_reserved_(prometheus::BuildGauge()
                          .Name("hybridserve_cache_bytes")
                          .Help("Cache bytes by class and state.")
                          .Register(r)
                          .Add({{"class", "state"}, {"state", "reserved"}})),
      leases_(MakeGauge(r, "hybridserve_cache_active_leases", "Leases currently held.")),
      page_evicted_lru_(MakeCounter(r, "hybridserve_cache_evictions_total", "Evictions by class and reason.",
                                    {{"class", "page"}, {"reason", "lru"}})),
      page_evicted_ttl_(prometheus::BuildCounter()
                            .Name("hybridserve_cache_evictions_total")
                            .Help("Evictions by class and reason.")
                            .Register(r)
                            .Add({{"class", "page"}, {"reason", "ttl"}})),
      state_evicted_lru_(prometheus::BuildCounter()
                             .Name("hybridserve_cache_evictions_total")
                             .Help("Evictions by class and reason.")
                             .Register(r)
                             .Add({{"class", "state"}, {"reason", "lru"}})),
      state_evicted_ttl_(prometheus::BuildCounter()
                             .Name("hybridserve_cache_evictions_total")
                             .Help("Evictions by class and reason.")
                             .Register(r)
                             .Add({{"class", "state"}, {"reason", "ttl"}})),
      state_dropped_with_pages_(prometheus::BuildCounter()
                                    .Name("hybridserve_cache_evictions_total")
                                    .Help("Evictions by class and reason.")
                                    .Register(r)
                                    .Add({{"class", "state"}, {"reason", "pages_gone"}})),
      checksum_failures_(
          MakeCounter(r, "hybridserve_cache_checksum_failures_total", "Entries whose bytes failed their checksum.")),
      expired_leases_(MakeCounter(r, "hybridserve_cache_expired_leases_total", "Leases that expired unreleased.")),
      expired_puts_(MakeCounter(r, "hybridserve_cache_expired_puts_total", "Puts reclaimed after stalling.")) {}

void ServiceMetrics::RecordLookup(const LookupResult& r, bool hit) {
  lookups_.Increment();
  if (hit && r.state.has_value()) {
    (r.state->state_kind == StateKind::kGridCheckpoint ? hits_grid_ : hits_exact_).Increment();
  }
  resume_depth_.Observe(static_cast<double>(r.resume_position));
  kv_match_depth_.Observe(static_cast<double>(r.kv_match_tokens));
}

void ServiceMetrics::RecordPut(bool ok, int64_t bytes, double seconds) {
  (ok ? puts_ok_ : puts_failed_).Increment();
  if (ok) put_bytes_.Increment(static_cast<double>(bytes));
  put_seconds_.Observe(seconds);
}

void ServiceMetrics::RecordGet(bool ok, int64_t bytes, double seconds) {
  (ok ? gets_ok_ : gets_failed_).Increment();
  if (ok) get_bytes_.Increment(static_cast<double>(bytes));
  get_seconds_.Observe(seconds);
}

void ServiceMetrics::SyncFromStats(const IndexStats& s) {
  absl::MutexLock lock(&mu_);
  page_resident_.Set(static_cast<double>(s.pages.resident_bytes));
  page_reserved_.Set(static_cast<double>(s.pages.reserved_bytes));
  state_resident_.Set(static_cast<double>(s.states.resident_bytes));
  state_reserved_.Set(static_cast<double>(s.states.reserved_bytes));
  leases_.Set(static_cast<double>(s.active_leases));
  Advance(page_evicted_lru_, s.pages.evicted_lru, last_.pages.evicted_lru);
  Advance(page_evicted_ttl_, s.pages.evicted_ttl, last_.pages.evicted_ttl);
  Advance(state_evicted_lru_, s.states.evicted_lru, last_.states.evicted_lru);
  Advance(state_evicted_ttl_, s.states.evicted_ttl, last_.states.evicted_ttl);
  Advance(state_dropped_with_pages_, s.states.dropped_with_pages, last_.states.dropped_with_pages);
  Advance(checksum_failures_, s.checksum_failures, last_.checksum_failures);
  Advance(expired_leases_, s.expired_leases, last_.expired_leases);
  Advance(expired_puts_, s.expired_puts, last_.expired_puts);
  last_ = s;
}

}  // namespace hybridserve::cachestore
