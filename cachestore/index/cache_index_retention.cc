// Session retention (PutSpec::ttl, PutSpec::pin): a state's own TTL, its
// session pin, and the per-namespace quota and cache-wide budget of pinned
// bytes. Members of CacheIndex (cache_index.h).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_index.h"

namespace hybridserve::cachestore {

void CacheIndex::RefreshExpiry(State* state) {
  if (!state->entry.committed || state->ttl <= absl::ZeroDuration()) return;
  if (state->expiry != absl::InfiniteFuture()) session_expiry_.erase({state->expiry, state});
  state->expiry = state->entry.last_use + state->ttl;
  session_expiry_.insert({state->expiry, state});
}

int64_t CacheIndex::PinBudget() const {
  return options_.pin_budget_bytes >= 0 ? options_.pin_budget_bytes : options_.state_budget_bytes / 2;
}

void CacheIndex::ApplyRetention(State* state, const PutSpec& spec, Reservation* r) {
  absl::Duration ttl = spec.ttl;
  if (spec.pin && ttl == absl::ZeroDuration()) ttl = options_.max_session_ttl;
  ttl = std::min(ttl, options_.max_session_ttl);
  if (ttl > state->ttl) {
    // A state gaining its own TTL moves from the class-TTL LRU set.
    const bool evictable = state->entry.evictable;
    if (evictable) StateLru(*state).erase({state->entry.tick, state});
    state->ttl = ttl;
    if (evictable) StateLru(*state).insert({state->entry.tick, state});
    RefreshExpiry(state);
  }
  if (spec.pin && !state->session_pin) {
    const std::string& tenant = state->node->root->tenant;
    const int64_t size = state->entry.size;
    auto used = tenant_pinned_bytes_.find(tenant);
    const int64_t tenant_pinned = used == tenant_pinned_bytes_.end() ? 0 : used->second;
    if (tenant_pinned + size > options_.pin_quota_bytes) {
      r->pin_refused = absl::StrCat("the tenant's pin quota of ", options_.pin_quota_bytes, " bytes is used (",
                                    tenant_pinned, " pinned, this state ", size, ")");
    } else if (pinned_bytes_ + size > PinBudget()) {
      r->pin_refused = absl::StrCat("the cache's pin budget of ", PinBudget(), " bytes is used (", pinned_bytes_,
                                    " pinned, this state ", size, ")");
    } else {
      const bool was_busy = IsBusy(*state);
      state->session_pin = true;
      tenant_pinned_bytes_[tenant] += size;
      pinned_bytes_ += size;
      pinned_states_++;
      if (!was_busy) {
        state->node->busy_states++;
        RefreshNode(state->node);
      }
      RefreshState(state);
    }
  }
  r->ttl = state->ttl;
  r->pinned = state->session_pin;
}

}  // namespace hybridserve::cachestore
