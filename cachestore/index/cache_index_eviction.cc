// Eviction and removal: making room by LRU or utility, expiry by deadline and
// TTL, the LRU and utility bookkeeping that orders them, and the removal of entries with what
// depends on them. Members of CacheIndex (cache_index.h).

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachestore/index/cache_index.h"
#include "common/logging.h"

namespace hybridserve::cachestore {

absl::Status CacheIndex::MakeRoom(EntryClass c, int64_t charge) {
  ClassStats& counters = Counters(c);
  while (counters.resident_bytes + counters.reserved_bytes + counters.metadata_bytes + charge > Budget(c)) {
    if (c == EntryClass::kPage) {
      if (page_lru_.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "page budget of ", Budget(c), " bytes is held by leased, pinned, in-flight or interior pages"));
      }
      Node* victim = page_lru_.begin()->second;
      if (UtilityPolicy()) {
        // GreedyDual: the clock rises to the victim's priority (a page whose
        // states went since its use may be below it).
        victim = std::get<Node*>(*page_utility_.begin());
        page_clock_ = std::max(page_clock_, victim->entry.priority);
      }
      RemoveNodeOnly(victim, RemoveReason::kLru);
    } else {
      if (state_lru_.empty() && session_lru_.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("state budget of ", Budget(c), " bytes is held by leased, pinned or in-flight states"));
      }
      State* victim = nullptr;
      if (UtilityPolicy()) {
        victim = std::get<State*>(*state_utility_.begin());
        state_clock_ = std::max(state_clock_, victim->entry.priority);
      } else {
        // The least recently used of both sets.
        const bool session =
            state_lru_.empty() || (!session_lru_.empty() && session_lru_.begin()->first < state_lru_.begin()->first);
        victim = (session ? session_lru_ : state_lru_).begin()->second;
      }
      RemoveState(victim, RemoveReason::kLru);
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> CacheIndex::Expire(absl::Time now) {
  // Each set is ordered by deadline: the work is what expires, not what is open.
  while (!lease_expiry_.empty() && lease_expiry_.begin()->first < now) {
    const uint64_t id = lease_expiry_.begin()->second;
    lease_expiry_.erase(lease_expiry_.begin());
    auto it = leases_.find(id);
    ReleaseLeaseEntries(it->second);
    totals_.expired_leases++;
    leases_.erase(it);
  }
  std::vector<uint64_t> reclaimed;
  for (auto it = put_deadlines_.begin(); it != put_deadlines_.end() && it->first < now; ++it) {
    reclaimed.push_back(it->second);
  }
  for (uint64_t id : reclaimed) {
    if (puts_.count(id) == 0) continue;  // gone with an aborted parent page
    totals_.expired_puts++;
    Abort(id);
  }
  // The evictable sets are in LRU order, and use times grow with ticks, so the
  // expired entries are a prefix of each set.
  while (!page_lru_.empty()) {
    Node* n = page_lru_.begin()->second;
    if (n->entry.last_use + options_.page_ttl > now) break;
    RemoveNodeOnly(n, RemoveReason::kTtl);
  }
  // States with their own TTL are in session_lru_ and expire below.
  while (!state_lru_.empty()) {
    State* s = state_lru_.begin()->second;
    if (s->entry.last_use + options_.state_ttl > now) break;
    RemoveState(s, RemoveReason::kTtl);
  }
  for (auto it = session_expiry_.begin(); it != session_expiry_.end() && it->first <= now;) {
    State* s = it->second;
    ++it;
    if (s->entry.pins > 0) continue;  // leased: it goes at the first Expire after the release
    RemoveState(s, RemoveReason::kTtl);
  }
  return reclaimed;
}

// --- LRU and utility bookkeeping --------------------------------------------

void CacheIndex::UseNode(Node* node, absl::Time now) {
  if (node->parent == nullptr) return;
  Entry& e = node->entry;
  const bool was = e.evictable;
  if (was) {
    page_lru_.erase({e.tick, node});
    if (UtilityPolicy()) page_utility_.erase({e.priority, e.tick, node});
  }
  e.tick = next_tick_++;
  e.last_use = now;
  if (UtilityPolicy()) {
    e.base = page_clock_;
    e.cost = CostOf(*node->root);
    e.priority = NodePriority(*node);
  }
  if (was) {
    page_lru_.insert({e.tick, node});
    if (UtilityPolicy()) page_utility_.insert({e.priority, e.tick, node});
  }
}

void CacheIndex::UseState(State* state, absl::Time now) {
  Entry& e = state->entry;
  const bool was = e.evictable;
  if (was) {
    StateLru(*state).erase({e.tick, state});
    if (UtilityPolicy()) state_utility_.erase({e.priority, e.tick, state});
  }
  e.tick = next_tick_++;
  e.last_use = now;
  if (UtilityPolicy()) {
    e.base = state_clock_;
    e.cost = CostOf(*state->node->root);
    e.priority = StatePriority(*state);
  }
  if (was) {
    StateLru(*state).insert({e.tick, state});
    if (UtilityPolicy()) state_utility_.insert({e.priority, e.tick, state});
  }
  RefreshExpiry(state);
}

void CacheIndex::RefreshNode(Node* node) {
  if (node->parent == nullptr) return;  // roots hold no bytes
  Entry& e = node->entry;
  const bool evictable = e.committed && e.pins == 0 && node->children.empty() && node->busy_states == 0;
  if (evictable == e.evictable) {
    if (evictable) RekeyNode(node);  // its states may have changed
    return;
  }
  if (evictable) {
    page_lru_.insert({e.tick, node});
    if (UtilityPolicy()) {
      e.priority = NodePriority(*node);
      page_utility_.insert({e.priority, e.tick, node});
    }
  } else {
    page_lru_.erase({e.tick, node});
    if (UtilityPolicy()) page_utility_.erase({e.priority, e.tick, node});
  }
  e.evictable = evictable;
}

void CacheIndex::RefreshState(State* state) {
  Entry& e = state->entry;
  const bool evictable = !IsBusy(*state);
  if (evictable == e.evictable) return;
  if (evictable) {
    StateLru(*state).insert({e.tick, state});
    if (UtilityPolicy()) {
      e.priority = StatePriority(*state);
      state_utility_.insert({e.priority, e.tick, state});
    }
  } else {
    StateLru(*state).erase({e.tick, state});
    if (UtilityPolicy()) state_utility_.erase({e.priority, e.tick, state});
  }
  e.evictable = evictable;
}

double CacheIndex::NodePriority(const Node& node) const {
  // The deepest state hanging here, or to come: states sit at depth *
  // page_size + tail.
  const int64_t deepest =
      node.depth * node.root->page_size + (node.tail_lengths.empty() ? 0 : node.tail_lengths.rbegin()->first);
  return node.entry.base + PageUtilityIncrement(EntryUtilityCost(node.entry), deepest, node.depth, node.entry.charge);
}

double CacheIndex::StatePriority(const State& state) const {
  return state.entry.base + StateUtilityIncrement(EntryUtilityCost(state.entry), state.position, state.entry.charge);
}

void CacheIndex::RekeyNode(Node* node) {
  Entry& e = node->entry;
  if (!UtilityPolicy() || !e.evictable) return;
  const double priority = NodePriority(*node);
  if (priority == e.priority) return;
  page_utility_.erase({e.priority, e.tick, node});
  e.priority = priority;
  page_utility_.insert({e.priority, e.tick, node});
}

// --- Removal ---------------------------------------------------------------

void CacheIndex::ForgetEntryBytes(EntryClass c, Entry* e) {
  ClassStats& counters = Counters(c);
  counters.metadata_bytes -= e->charge - e->size;
  if (e->committed) {
    counters.resident_bytes -= e->size;
    counters.entries--;
  } else {
    counters.reserved_bytes -= e->size;
    auto put = puts_.find(e->reservation_id);
    put_deadlines_.erase({put->second.deadline, e->reservation_id});
    puts_.erase(put);
  }
}

void CacheIndex::RemoveState(State* state, RemoveReason reason) {
  CountRemoval(reason, state->entry, state_stats_);
  if (reason == RemoveReason::kLru && options_.on_evict) options_.on_evict(StateInfo(*state));
  if (state->entry.evictable) {
    StateLru(*state).erase({state->entry.tick, state});
    if (UtilityPolicy()) state_utility_.erase({state->entry.priority, state->entry.tick, state});
  }
  if (state->expiry != absl::InfiniteFuture()) session_expiry_.erase({state->expiry, state});
  Node* node = state->node;
  if (state->session_pin) {
    auto tenant = tenant_pinned_bytes_.find(node->root->tenant);
    DCHECK(tenant != tenant_pinned_bytes_.end());
    if ((tenant->second -= state->entry.size) == 0) tenant_pinned_bytes_.erase(tenant);
    pinned_bytes_ -= state->entry.size;
    pinned_states_--;
  }
  if (IsBusy(*state)) node->busy_states--;
  ForgetEntryBytes(EntryClass::kState, &state->entry);
  // Out of its node in O(1): the last state takes its slot.
  std::vector<State*>& v = node->states;
  v[state->slot] = v.back();
  v[state->slot]->slot = state->slot;
  v.pop_back();
  auto length = node->tail_lengths.find(static_cast<int64_t>(state->tail.size()));
  if (--length->second == 0) node->tail_lengths.erase(length);
  states_.erase(state->key);  // destroys *state
  RefreshAfterRemoval(node);
}

void CacheIndex::RemoveSubtree(Node* node, RemoveReason reason) {
  while (!node->children.empty()) {
    RemoveSubtree(node->children.back(), reason == RemoveReason::kAborted ? reason : RemoveReason::kWithPages);
  }
  RemoveNodeOnly(node, reason);
}

void CacheIndex::RemoveNodeOnly(Node* node, RemoveReason reason) {
  DCHECK(node->children.empty());
  DCHECK(node->parent != nullptr);
  const bool evicted = reason == RemoveReason::kLru && options_.on_evict;
  while (!node->states.empty()) {
    State* state = node->states.back();
    if (evicted && state->entry.committed) options_.on_evict(StateInfo(*state));
    RemoveState(state, RemoveReason::kWithPages);
  }
  CountRemoval(reason, node->entry, page_stats_);
  if (evicted) options_.on_evict(PageInfo(*node, node->root->page_size));
  if (node->entry.evictable) {
    page_lru_.erase({node->entry.tick, node});
    if (UtilityPolicy()) page_utility_.erase({node->entry.priority, node->entry.tick, node});
  }
  ForgetEntryBytes(EntryClass::kPage, &node->entry);
  Node* parent = node->parent;
  auto& siblings = parent->children;
  siblings.erase(std::find(siblings.begin(), siblings.end(), node));
  pages_.erase(node->key);  // destroys *node
  RefreshAfterRemoval(parent);
}

void CacheIndex::CountRemoval(RemoveReason reason, const Entry& e, ClassStats& counters) {
  if (reason == RemoveReason::kLru) counters.evicted_lru++;
  if (reason == RemoveReason::kTtl) counters.evicted_ttl++;
  if (reason == RemoveReason::kWithPages && e.committed) counters.dropped_with_pages++;
}

void CacheIndex::RefreshAfterRemoval(Node* node) {
  if (node->parent == nullptr) {
    MaybeRemoveRoot(node);
  } else {
    RefreshNode(node);
  }
}

void CacheIndex::MaybeRemoveRoot(Node* root) {
  // A pinned root is in use by a Reserve that is making room under it.
  if (root->entry.pins != 0 || !root->children.empty() || !root->states.empty()) return;
  if (root->model_cost.has_value()) roots_with_model_cost_--;
  roots_.erase(root->key);
}

}  // namespace hybridserve::cachestore
