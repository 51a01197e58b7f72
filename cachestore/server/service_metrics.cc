#include "cachestore/server/service_metrics.h"

#include "common/metrics.h"

namespace hybridserve::cachestore {
namespace {

using common::AdvanceCounter;
using common::CounterFamily;
using common::GaugeFamily;
using common::UnlabelledHistogram;

const char* PolicyReason(EvictionPolicy policy) { return policy == EvictionPolicy::kUtility ? "utility" : "lru"; }

}  // namespace

// The families, each registered once; the members below pick their labels.
struct Families {
  explicit Families(prometheus::Registry& r)
      : lookups(CounterFamily(r, "hybridserve_cache_lookups_total", "Prefix-cache lookups.")),
        hits(CounterFamily(r, "hybridserve_cache_hits_total", "Lookups that found a resume point, by state kind.")),
        puts(CounterFamily(r, "hybridserve_cache_puts_total", "Put streams by outcome.")),
        put_bytes(CounterFamily(r, "hybridserve_cache_put_bytes_total", "Bytes committed by puts.")),
        gets(CounterFamily(r, "hybridserve_cache_gets_total", "Get streams by outcome.")),
        get_bytes(CounterFamily(r, "hybridserve_cache_get_bytes_total", "Bytes served by gets.")),
        shm_reads(CounterFamily(r, "hybridserve_cache_shm_reads_total",
                                "Reads on the shared-memory socket by outcome (ok, error, refused_peer).")),
        shm_puts(CounterFamily(r, "hybridserve_cache_shm_puts_total",
                               "Entries put on the shared-memory socket by outcome (ok, error).")),
        shm_put_bytes(CounterFamily(r, "hybridserve_cache_shm_put_bytes_total",
                                    "Entry bytes committed by puts on the shared-memory socket.")),
        shm_bytes(CounterFamily(r, "hybridserve_cache_shm_bytes_total",
                                "Entry bytes read by shared memory (sent as slab descriptors, not copied).")),
        bulk_reads(
            CounterFamily(r, "hybridserve_cache_bulk_reads_total", "Reads on the bulk port by outcome (ok, error).")),
        bulk_bytes(CounterFamily(r, "hybridserve_cache_bulk_bytes_total", "Entry bytes sent on the bulk port.")),
        bulk_puts(CounterFamily(r, "hybridserve_cache_bulk_puts_total",
                                "Entries put on the bulk port by outcome (ok, error).")),
        bulk_put_bytes(CounterFamily(r, "hybridserve_cache_bulk_put_bytes_total",
                                     "Entry bytes committed by puts on the bulk port.")),
        calls_refused(CounterFamily(r, "hybridserve_cache_calls_refused_total",
                                    "Calls refused by --max_streams or --max_streams_per_peer.")),
        bytes(GaugeFamily(r, "hybridserve_cache_bytes", "Cache bytes by class and state.")),
        leases(GaugeFamily(r, "hybridserve_cache_active_leases", "Leases currently held.")),
        namespaces(GaugeFamily(r, "hybridserve_cache_namespaces",
                               "Namespaces held, by the cost model utility eviction values them by: the one their "
                               "puts registered (cost=registered) or the --utility_flops_per_token* flags "
                               "(cost=fallback).")),
        evictions(CounterFamily(r, "hybridserve_cache_evictions_total", "Evictions by class and reason.")),
        checksum_failures(CounterFamily(r, "hybridserve_cache_checksum_failures_total",
                                        "Entries whose bytes failed their checksum.")),
        expired_leases(CounterFamily(r, "hybridserve_cache_expired_leases_total", "Leases that expired unreleased.")),
        expired_puts(CounterFamily(r, "hybridserve_cache_expired_puts_total", "Puts reclaimed after stalling.")),
        disk_bytes(GaugeFamily(r, "hybridserve_cache_disk_bytes",
                               "Disk tier bytes (whole files): on disk (state=resident), its budget (state=budget), "
                               "evicted entries waiting for the writer (state=queued).")),
        disk_entries(GaugeFamily(r, "hybridserve_cache_disk_entries", "Entries on the disk tier.")),
        disk_writes(CounterFamily(r, "hybridserve_cache_disk_writes_total",
                                  "Entries for the disk tier by outcome: written (ok), dropped (the write queue "
                                  "full, larger than the disk budget, or queued at shutdown), failed (I/O error).")),
        disk_reads(CounterFamily(r, "hybridserve_cache_disk_reads_total",
                                 "Entries a lookup read from the disk tier by outcome: ok, or failed (verification "
                                 "or decoding; the entry is removed and the lookup misses there).")),
        disk_promoted(CounterFamily(r, "hybridserve_cache_disk_promoted_total",
                                    "Entries lookups read back from the disk tier into memory.")),
        disk_promoted_bytes(CounterFamily(r, "hybridserve_cache_disk_promoted_bytes_total",
                                          "Entry bytes lookups read back from the disk tier into memory.")),
        disk_evictions(CounterFamily(r, "hybridserve_cache_disk_evictions_total", "Entries the disk budget evicted.")),
        disk_shutdown_spilled(CounterFamily(r, "hybridserve_cache_disk_shutdown_spilled_total",
                                            "Entries in memory written to the disk tier at shutdown.")) {}

  prometheus::Family<prometheus::Counter>& lookups;
  prometheus::Family<prometheus::Counter>& hits;
  prometheus::Family<prometheus::Counter>& puts;
  prometheus::Family<prometheus::Counter>& put_bytes;
  prometheus::Family<prometheus::Counter>& gets;
  prometheus::Family<prometheus::Counter>& get_bytes;
  prometheus::Family<prometheus::Counter>& shm_reads;
  prometheus::Family<prometheus::Counter>& shm_puts;
  prometheus::Family<prometheus::Counter>& shm_put_bytes;
  prometheus::Family<prometheus::Counter>& shm_bytes;
  prometheus::Family<prometheus::Counter>& bulk_reads;
  prometheus::Family<prometheus::Counter>& bulk_bytes;
  prometheus::Family<prometheus::Counter>& bulk_puts;
  prometheus::Family<prometheus::Counter>& bulk_put_bytes;
  prometheus::Family<prometheus::Counter>& calls_refused;
  prometheus::Family<prometheus::Gauge>& bytes;
  prometheus::Family<prometheus::Gauge>& leases;
  prometheus::Family<prometheus::Gauge>& namespaces;
  prometheus::Family<prometheus::Counter>& evictions;
  prometheus::Family<prometheus::Counter>& checksum_failures;
  prometheus::Family<prometheus::Counter>& expired_leases;
  prometheus::Family<prometheus::Counter>& expired_puts;
  prometheus::Family<prometheus::Gauge>& disk_bytes;
  prometheus::Family<prometheus::Gauge>& disk_entries;
  prometheus::Family<prometheus::Counter>& disk_writes;
  prometheus::Family<prometheus::Counter>& disk_reads;
  prometheus::Family<prometheus::Counter>& disk_promoted;
  prometheus::Family<prometheus::Counter>& disk_promoted_bytes;
  prometheus::Family<prometheus::Counter>& disk_evictions;
  prometheus::Family<prometheus::Counter>& disk_shutdown_spilled;
};

ServiceMetrics::ServiceMetrics(prometheus::Registry& r, EvictionPolicy policy)
    : ServiceMetrics(r, Families(r), policy) {}

ServiceMetrics::ServiceMetrics(prometheus::Registry& r, const Families& f, EvictionPolicy policy)
    : lookups_(f.lookups.Add({})),
      hits_grid_(f.hits.Add({{"kind", "grid_checkpoint"}})),
      hits_exact_(f.hits.Add({{"kind", "exact_prefix"}})),
      resume_depth_(UnlabelledHistogram(r, "hybridserve_cache_resume_depth_tokens", "Resume point of lookups, tokens.",
                                        common::ExponentialBuckets(16, 2, 14))),
      kv_match_depth_(UnlabelledHistogram(r, "hybridserve_cache_kv_match_depth_tokens",
                                          "Tokens covered by matched KV pages, tokens.",
                                          common::ExponentialBuckets(16, 2, 14))),
      puts_ok_(f.puts.Add({{"outcome", "ok"}})),
      puts_failed_(f.puts.Add({{"outcome", "error"}})),
      put_bytes_(f.put_bytes.Add({})),
      put_seconds_(UnlabelledHistogram(r, "hybridserve_cache_put_seconds", "Duration of put streams.",
                                       common::ExponentialBuckets(1e-4, 2, 18))),
      gets_ok_(f.gets.Add({{"outcome", "ok"}})),
      gets_failed_(f.gets.Add({{"outcome", "error"}})),
      get_bytes_(f.get_bytes.Add({})),
      get_seconds_(UnlabelledHistogram(r, "hybridserve_cache_get_seconds", "Duration of get streams.",
                                       common::ExponentialBuckets(1e-4, 2, 18))),
      shm_reads_ok_(f.shm_reads.Add({{"outcome", "ok"}})),
      shm_reads_failed_(f.shm_reads.Add({{"outcome", "error"}})),
      shm_peers_refused_(f.shm_reads.Add({{"outcome", "refused_peer"}})),
      shm_bytes_(f.shm_bytes.Add({})),
      shm_puts_ok_(f.shm_puts.Add({{"outcome", "ok"}})),
      shm_puts_failed_(f.shm_puts.Add({{"outcome", "error"}})),
      shm_put_bytes_(f.shm_put_bytes.Add({})),
      bulk_reads_ok_(f.bulk_reads.Add({{"outcome", "ok"}})),
      bulk_reads_failed_(f.bulk_reads.Add({{"outcome", "error"}})),
      bulk_bytes_(f.bulk_bytes.Add({})),
      bulk_puts_ok_(f.bulk_puts.Add({{"outcome", "ok"}})),
      bulk_puts_failed_(f.bulk_puts.Add({{"outcome", "error"}})),
      bulk_put_bytes_(f.bulk_put_bytes.Add({})),
      calls_refused_(f.calls_refused.Add({})),
      page_resident_(f.bytes.Add({{"class", "page"}, {"state", "resident"}})),
      page_reserved_(f.bytes.Add({{"class", "page"}, {"state", "reserved"}})),
      state_resident_(f.bytes.Add({{"class", "state"}, {"state", "resident"}})),
      state_reserved_(f.bytes.Add({{"class", "state"}, {"state", "reserved"}})),
      page_metadata_(f.bytes.Add({{"class", "page"}, {"state", "metadata"}})),
      state_metadata_(f.bytes.Add({{"class", "state"}, {"state", "metadata"}})),
      leases_(f.leases.Add({})),
      namespaces_registered_(f.namespaces.Add({{"cost", "registered"}})),
      namespaces_fallback_(f.namespaces.Add({{"cost", "fallback"}})),
      page_evicted_lru_(f.evictions.Add({{"class", "page"}, {"reason", PolicyReason(policy)}})),
      page_evicted_ttl_(f.evictions.Add({{"class", "page"}, {"reason", "ttl"}})),
      state_evicted_lru_(f.evictions.Add({{"class", "state"}, {"reason", PolicyReason(policy)}})),
      state_evicted_ttl_(f.evictions.Add({{"class", "state"}, {"reason", "ttl"}})),
      state_dropped_with_pages_(f.evictions.Add({{"class", "state"}, {"reason", "pages_gone"}})),
      checksum_failures_(f.checksum_failures.Add({})),
      expired_leases_(f.expired_leases.Add({})),
      expired_puts_(f.expired_puts.Add({})),
      disk_resident_(f.disk_bytes.Add({{"state", "resident"}})),
      disk_budget_(f.disk_bytes.Add({{"state", "budget"}})),
      disk_queued_(f.disk_bytes.Add({{"state", "queued"}})),
      disk_entries_(f.disk_entries.Add({})),
      disk_writes_ok_(f.disk_writes.Add({{"outcome", "ok"}})),
      disk_writes_dropped_(f.disk_writes.Add({{"outcome", "dropped"}})),
      disk_writes_failed_(f.disk_writes.Add({{"outcome", "failed"}})),
      disk_reads_ok_(f.disk_reads.Add({{"outcome", "ok"}})),
      disk_reads_failed_(f.disk_reads.Add({{"outcome", "failed"}})),
      disk_promoted_(f.disk_promoted.Add({})),
      disk_promoted_bytes_(f.disk_promoted_bytes.Add({})),
      disk_evictions_(f.disk_evictions.Add({})),
      disk_shutdown_spilled_(f.disk_shutdown_spilled.Add({})) {}

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

void ServiceMetrics::RecordShmRead(bool ok, bool refused_peer, int64_t bytes) {
  (refused_peer ? shm_peers_refused_ : ok ? shm_reads_ok_ : shm_reads_failed_).Increment();
  if (ok) shm_bytes_.Increment(static_cast<double>(bytes));
}

void ServiceMetrics::RecordShmPut(bool ok, int64_t bytes, double seconds) {
  RecordPut(ok, bytes, seconds);
  (ok ? shm_puts_ok_ : shm_puts_failed_).Increment();
  shm_put_bytes_.Increment(static_cast<double>(bytes));
}

void ServiceMetrics::RecordBulkRead(bool ok, int64_t bytes) {
  (ok ? bulk_reads_ok_ : bulk_reads_failed_).Increment();
  if (ok) bulk_bytes_.Increment(static_cast<double>(bytes));
}

void ServiceMetrics::RecordBulkPut(bool ok, int64_t bytes, double seconds) {
  RecordPut(ok, bytes, seconds);
  (ok ? bulk_puts_ok_ : bulk_puts_failed_).Increment();
  bulk_put_bytes_.Increment(static_cast<double>(bytes));
}

void ServiceMetrics::RecordGet(bool ok, int64_t bytes, double seconds) {
  (ok ? gets_ok_ : gets_failed_).Increment();
  if (ok) get_bytes_.Increment(static_cast<double>(bytes));
  get_seconds_.Observe(seconds);
}

void ServiceMetrics::RecordRefusedCall() { calls_refused_.Increment(); }

void ServiceMetrics::SyncFromStats(const IndexStats& s) {
  absl::MutexLock lock(&mu_);
  page_resident_.Set(static_cast<double>(s.pages.resident_bytes));
  page_reserved_.Set(static_cast<double>(s.pages.reserved_bytes));
  state_resident_.Set(static_cast<double>(s.states.resident_bytes));
  state_reserved_.Set(static_cast<double>(s.states.reserved_bytes));
  page_metadata_.Set(static_cast<double>(s.pages.metadata_bytes));
  state_metadata_.Set(static_cast<double>(s.states.metadata_bytes));
  leases_.Set(static_cast<double>(s.active_leases));
  namespaces_registered_.Set(static_cast<double>(s.namespaces_with_model_cost));
  namespaces_fallback_.Set(static_cast<double>(s.namespaces - s.namespaces_with_model_cost));
  AdvanceCounter(page_evicted_lru_, s.pages.evicted_lru, last_.pages.evicted_lru);
  AdvanceCounter(page_evicted_ttl_, s.pages.evicted_ttl, last_.pages.evicted_ttl);
  AdvanceCounter(state_evicted_lru_, s.states.evicted_lru, last_.states.evicted_lru);
  AdvanceCounter(state_evicted_ttl_, s.states.evicted_ttl, last_.states.evicted_ttl);
  AdvanceCounter(state_dropped_with_pages_, s.states.dropped_with_pages, last_.states.dropped_with_pages);
  AdvanceCounter(checksum_failures_, s.checksum_failures, last_.checksum_failures);
  AdvanceCounter(expired_leases_, s.expired_leases, last_.expired_leases);
  AdvanceCounter(expired_puts_, s.expired_puts, last_.expired_puts);
  const DiskTierUsage& d = s.disk;
  const DiskTierUsage& was = last_.disk;
  disk_resident_.Set(static_cast<double>(d.bytes));
  disk_budget_.Set(static_cast<double>(d.budget_bytes));
  disk_queued_.Set(static_cast<double>(d.queued_bytes));
  disk_entries_.Set(static_cast<double>(d.entries));
  AdvanceCounter(disk_writes_ok_, d.writes, was.writes);
  AdvanceCounter(disk_writes_dropped_, d.write_drops, was.write_drops);
  AdvanceCounter(disk_writes_failed_, d.write_failures, was.write_failures);
  AdvanceCounter(disk_reads_ok_, d.read_hits, was.read_hits);
  AdvanceCounter(disk_reads_failed_, d.read_failures, was.read_failures);
  AdvanceCounter(disk_promoted_, d.promoted_entries, was.promoted_entries);
  AdvanceCounter(disk_promoted_bytes_, d.promoted_bytes, was.promoted_bytes);
  AdvanceCounter(disk_evictions_, d.evictions, was.evictions);
  AdvanceCounter(disk_shutdown_spilled_, d.shutdown_spilled, was.shutdown_spilled);
  last_ = s;
}

}  // namespace hybridserve::cachestore
