// CacheIndex::CheckInvariants: every counter and structural invariant
// recomputed from scratch (cache_index.h). For tests.

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_index.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {

absl::Status CacheIndex::CheckStateSlots(const Node& node) const {
  std::map<int64_t, int> lengths;
  for (size_t i = 0; i < node.states.size(); ++i) {
    if (node.states[i]->slot != i) return absl::InternalError("state slot disagrees with its node's list");
    lengths[static_cast<int64_t>(node.states[i]->tail.size())]++;
  }
  if (lengths != node.tail_lengths) return absl::InternalError("tail length counts out of date");
  return absl::OkStatus();
}

absl::Status CacheIndex::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  ClassStats pages, states;
  absl::flat_hash_map<const void*, int> expected_pins;
  for (const auto& [id, lease] : leases_) {
    if (lease_expiry_.count({lease.expiry, id}) != 1) return fail("lease ", id, " missing from the expiry order");
    std::vector<const Held*> held = {&lease.state};
    if (lease.deepest.has_value()) held.push_back(&*lease.deepest);
    for (const Held* e : held) {
      if (e->entry_class == EntryClass::kPage) {
        auto it = pages_.find(e->key);
        if (it != pages_.end() && it->second->entry.serial == e->serial) expected_pins[it->second.get()]++;
      } else {
        auto it = states_.find(e->key);
        if (it != states_.end() && it->second->entry.serial == e->serial) expected_pins[it->second.get()]++;
      }
    }
  }
  if (lease_expiry_.size() != leases_.size()) return fail("lease expiry order holds released leases");
  for (const auto& [id, put] : puts_) {
    if (put_deadlines_.count({put.deadline, id}) != 1) return fail("put ", id, " missing from the deadline order");
  }
  if (put_deadlines_.size() != puts_.size()) return fail("put deadline order holds finished puts");
  size_t reserved_entries = 0;
  size_t evictable_pages = 0, evictable_states = 0;
  size_t expiring_states = 0;
  int64_t pinned_bytes = 0, pinned_states = 0;
  absl::flat_hash_map<std::string, int64_t> pinned_by_tenant;
  for (const auto& [key, node] : pages_) {
    const Entry& e = node->entry;
    if (node->parent == nullptr || node->root == nullptr) return fail("page without parent or root");
    if (node->depth != node->parent->depth + 1) return fail("page depth disagrees with parent");
    if (std::count(node->parent->children.begin(), node->parent->children.end(), node.get()) != 1) {
      return fail("page missing from its parent's children");
    }
    if (node->parent->parent == nullptr ? roots_.find(node->parent->key) == roots_.end()
                                        : pages_.find(node->parent->key) == pages_.end()) {
      return fail("page's parent is not indexed");
    }
    (e.committed ? pages.resident_bytes : pages.reserved_bytes) += e.size;
    pages.metadata_bytes += e.charge - e.size;
    if (e.charge != e.size + options_.entry_overhead_bytes) return fail("page charge disagrees with its size");
    if (node->jump == nullptr || node->jump->depth >= node->depth || node->jump->root != node->root ||
        LevelAncestor(node.get(), node->jump->depth) != node->jump) {
      return fail("page jump pointer is not a proper ancestor");
    }
    if (e.committed) pages.entries++;
    if (!e.committed) reserved_entries++;
    if (e.pins != expected_pins[node.get()]) return fail("page pins ", e.pins, " != leases");
    int busy = 0;
    for (const State* s : node->states) busy += IsBusy(*s) ? 1 : 0;
    if (busy != node->busy_states) return fail("busy_states out of date");
    RETURN_IF_ERROR(CheckStateSlots(*node));
    const bool evictable = e.committed && e.pins == 0 && node->children.empty() && busy == 0;
    if (evictable != e.evictable || evictable != (page_lru_.count({e.tick, node.get()}) == 1)) {
      return fail("page LRU membership out of date");
    }
    if (UtilityPolicy() && (evictable != (page_utility_.count({e.priority, e.tick, node.get()}) == 1) ||
                            (evictable && e.priority != NodePriority(*node)))) {
      return fail("page utility key out of date");
    }
    evictable_pages += evictable ? 1 : 0;
  }
  int64_t roots_with_model_cost = 0;
  for (const auto& [key, root] : roots_) {
    if (root->children.empty() && root->states.empty()) return fail("empty root kept");
    if (root->model_cost.has_value()) {
      roots_with_model_cost++;
      if (!PrefillCostProblem(*root->model_cost).empty()) return fail("namespace model cost out of range");
    }
    if (root->jump != root.get()) return fail("root jump pointer is not itself");
    RETURN_IF_ERROR(CheckStateSlots(*root));
    int busy = 0;
    for (const State* s : root->states) busy += IsBusy(*s) ? 1 : 0;
    if (busy != root->busy_states) return fail("root busy_states out of date");
  }
  if (roots_with_model_cost != roots_with_model_cost_) return fail("namespaces with a model cost miscounted");
  for (const auto& [key, s] : states_) {
    const Entry& e = s->entry;
    (e.committed ? states.resident_bytes : states.reserved_bytes) += e.size;
    states.metadata_bytes += e.charge - e.size;
    if (e.charge != e.size + options_.entry_overhead_bytes + static_cast<int64_t>(s->tail.size() * sizeof(TokenId))) {
      return fail("state charge disagrees with its size and tail");
    }
    if (e.committed) states.entries++;
    if (!e.committed) reserved_entries++;
    if (e.pins != expected_pins[s.get()]) return fail("state pins ", e.pins, " != leases");
    if (std::count(s->node->states.begin(), s->node->states.end(), s.get()) != 1) {
      return fail("state missing from its node");
    }
    if (s->position != s->node->depth * s->node->root->page_size + static_cast<int64_t>(s->tail.size())) {
      return fail("state position disagrees with its node");
    }
    const bool evictable = !IsBusy(*s);
    if (evictable != e.evictable || evictable != (StateLru(*s).count({e.tick, s.get()}) == 1)) {
      return fail("state LRU membership out of date");
    }
    if (UtilityPolicy() && (evictable != (state_utility_.count({e.priority, e.tick, s.get()}) == 1) ||
                            (evictable && e.priority != StatePriority(*s)))) {
      return fail("state utility key out of date");
    }
    evictable_states += evictable ? 1 : 0;
    if (s->session_pin) {
      pinned_bytes += e.size;
      pinned_states++;
      pinned_by_tenant[s->node->root->tenant] += e.size;
    }
    if (s->ttl > options_.max_session_ttl) return fail("state TTL above max_session_ttl");
    const bool expiring = e.committed && s->ttl > absl::ZeroDuration();
    if (expiring && (s->expiry != e.last_use + s->ttl || session_expiry_.count({s->expiry, s.get()}) != 1)) {
      return fail("session expiry out of date");
    }
    if (!expiring && s->expiry != absl::InfiniteFuture()) return fail("expiry kept for a state without a TTL");
    expiring_states += expiring ? 1 : 0;
  }
  if (expiring_states != session_expiry_.size()) return fail("session expiry set holds removed states");
  if (pinned_bytes != pinned_bytes_ || pinned_states != pinned_states_) return fail("pin accounting drifted");
  if (pinned_by_tenant != tenant_pinned_bytes_) return fail("tenant pin accounting drifted");
  for (const auto& [tenant, bytes] : tenant_pinned_bytes_) {
    if (bytes > options_.pin_quota_bytes) return fail("tenant pin quota exceeded");
  }
  if (pinned_bytes_ > PinBudget()) return fail("pin budget exceeded");
  if (evictable_pages != page_lru_.size() || evictable_states != state_lru_.size() + session_lru_.size()) {
    return fail("LRU sets hold removed entries");
  }
  if (UtilityPolicy() ? (evictable_pages != page_utility_.size() || evictable_states != state_utility_.size())
                      : (!page_utility_.empty() || !state_utility_.empty())) {
    return fail("utility sets hold removed entries");
  }
  if (reserved_entries != puts_.size()) return fail("reserved entries ", reserved_entries, " != puts ", puts_.size());
  if (pages.resident_bytes != page_stats_.resident_bytes || pages.reserved_bytes != page_stats_.reserved_bytes ||
      pages.entries != page_stats_.entries || pages.metadata_bytes != page_stats_.metadata_bytes) {
    return fail("page accounting drifted");
  }
  if (states.resident_bytes != state_stats_.resident_bytes || states.reserved_bytes != state_stats_.reserved_bytes ||
      states.entries != state_stats_.entries || states.metadata_bytes != state_stats_.metadata_bytes) {
    return fail("state accounting drifted");
  }
  if (pages.resident_bytes + pages.reserved_bytes + pages.metadata_bytes > options_.page_budget_bytes) {
    return fail("page budget exceeded");
  }
  if (states.resident_bytes + states.reserved_bytes + states.metadata_bytes > options_.state_budget_bytes) {
    return fail("state budget exceeded");
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
