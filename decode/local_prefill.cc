#include "decode/local_prefill.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace hybridserve::decode {

LocalPrefill::LocalPrefill(cachestore::CacheClient& cache, const cachestore::ModelNamespace& ns,
                           cachestore::CacheBackoff& backoff, int64_t max_tokens, KeepingPrefill prefill)
    : cache_(cache), namespace_(ns), backoff_(backoff), max_tokens_(max_tokens), prefill_(std::move(prefill)) {}

std::optional<prefill::KeptPrefill> LocalPrefill::TryPrefill(const GenerateRequest& request,
                                                             const engine::SequenceTable& table) {
  if (backoff_.Skipping()) return std::nullopt;  // a cache that just timed out
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  const int64_t positions = prompt + request.stop.max_tokens;
  if (table.num_free_slots() < 1 || table.num_free_pages() < table.PagesFor(positions)) return std::nullopt;
  // Where the cache would resume the prompt (a probe: nothing leased). Only
  // a continuation of what the cache holds is prefilled here: a new prompt
  // is the prefill pool's.
  const absl::Time probe_start = absl::Now();
  absl::StatusOr<cachestore::LookupResult> probe =
      cache_.Lookup(namespace_.For(request.tenant, request.cache_salt, request.prompt), request.prompt,
                    cachestore::LookupMode::kProbeOnly);
  if (!probe.ok()) {
    backoff_.Note(probe.status());
    return std::nullopt;
  }
  if (!probe->state.has_value() || probe->resume_position <= 0 || prompt - probe->resume_position > max_tokens_) {
    return std::nullopt;
  }
  const absl::Duration probe_time = absl::Now() - probe_start;
  absl::StatusOr<prefill::KeptPrefill> kept = prefill_(PrefillCallFor(request), positions);
  absl::MutexLock lock(&mu_);
  if (!kept.ok()) {
    ++counts_.failures;
    int64_t held_back = 0;
    if (log_limiter_.Allow(absl::StrCat("local prefill ", common::FailureReason(kept.status())), &held_back)) {
      LOG(WARNING) << "request " << request.request_id
                   << ": prefilling it here failed, the prefill pool takes it: " << kept.status()
                   << common::HeldBack(held_back);
    }
    return std::nullopt;
  }
  ++counts_.prefills;
  counts_.tokens += prompt - kept->outcome.usage.cached_tokens;
  counts_.resume += probe_time + kept->outcome.resume_time;
  counts_.compute += kept->outcome.compute_time;
  return *std::move(kept);
}

LocalPrefill::Counts LocalPrefill::counts() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace hybridserve::decode
