#include "cachestore/index/cache_index.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokens.h"

namespace hybridserve::cachestore {
CacheIndex::CacheIndex(const CacheIndexOptions& options)
    : options_(options),
      // Free buffers are outside the budgets: at most an eighth of them.
      blob_pool_(BlobPool::Create(
          std::min(options.blob_pool_bytes, options.page_budget_bytes / 8 + options.state_budget_bytes / 8),
          options.blob_storage)) {
  page_stats_.budget_bytes = options.page_budget_bytes;
  state_stats_.budget_bytes = options.state_budget_bytes;
}

CacheIndex::~CacheIndex() = default;

int64_t CacheIndex::Budget(EntryClass c) const {
  return c == EntryClass::kPage ? options_.page_budget_bytes : options_.state_budget_bytes;
}

ClassStats& CacheIndex::Counters(EntryClass c) { return c == EntryClass::kPage ? page_stats_ : state_stats_; }

absl::Status CacheIndex::ValidateSpec(const PutSpec& spec) const {
  if (!IsValidPageSize(spec.page_size)) return absl::InvalidArgumentError(PageSizeProblem(spec.page_size));
  // A page holds the K and V of every attention layer: none, in a model
  // without attention layers, whose pages still chain the prefix for the
  // states hung on them. A state always has bytes.
  if (spec.size_bytes < 0 || (spec.size_bytes == 0 && spec.entry_class == EntryClass::kState)) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.entry_class == EntryClass::kState ? "state" : "page", " entry size ", spec.size_bytes,
                     spec.entry_class == EntryClass::kState ? " must be > 0" : " must be >= 0"));
  }
  for (TokenId t : spec.tokens) {
    if (t < 0) return absl::InvalidArgumentError(absl::StrCat("negative token id ", t));
  }
  if (spec.ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ttl ", absl::FormatDuration(spec.ttl), " is negative"));
  }
  if (spec.entry_class == EntryClass::kPage) {
    if (spec.ttl != absl::ZeroDuration() || spec.pin) {
      return absl::InvalidArgumentError("session retention (ttl, pin) applies to states only");
    }
    if (static_cast<int64_t>(spec.tokens.size()) != spec.page_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("a page holds exactly page_size=", spec.page_size, " tokens, got ", spec.tokens.size()));
    }
  } else {
    if (static_cast<int64_t>(spec.tokens.size()) >= spec.page_size) {
      return absl::InvalidArgumentError(absl::StrCat("a state's tail holds fewer than page_size=", spec.page_size,
                                                     " tokens, got ", spec.tokens.size()));
    }
    if (spec.position <= 0 || spec.position > options_.max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("state position ", spec.position, " outside [1, ", options_.max_tokens, "]"));
    }
  }
  RETURN_IF_ERROR(CheckModelCost(spec.model_cost));
  // Checked last: the charge counts the tail, which the checks above bound.
  const int64_t charge = Charge(spec);
  if (charge > Budget(spec.entry_class)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "entry of ", spec.size_bytes, " bytes (", charge, " with its index memory) exceeds the ",
        spec.entry_class == EntryClass::kPage ? "page" : "state", " budget of ", Budget(spec.entry_class), " bytes"));
  }
  return absl::OkStatus();
}

int64_t CacheIndex::Charge(const PutSpec& spec) const {
  int64_t charge = spec.size_bytes + options_.entry_overhead_bytes;
  if (spec.entry_class == EntryClass::kState) charge += static_cast<int64_t>(spec.tokens.size() * sizeof(TokenId));
  return charge;
}

absl::StatusOr<Reservation> CacheIndex::Reserve(const PutSpec& spec, absl::Time now) {
  RETURN_IF_ERROR(ValidateSpec(spec));
  const EntryClass cls = spec.entry_class;

  // Find or create the namespace root.
  Node* root = nullptr;
  if (auto it = roots_.find(spec.ns); it != roots_.end()) {
    root = it->second.get();
    if (root->page_size != spec.page_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace uses page_size ", root->page_size, ", put says ", spec.page_size));
    }
  }

  // The parent: a page of this namespace, or its root (created below if new).
  Node* parent = nullptr;
  if (spec.parent.has_value()) {
    auto it = pages_.find(*spec.parent);
    if (it == pages_.end() || root == nullptr || it->second->root != root) {
      return absl::FailedPreconditionError(absl::StrCat("parent page ", spec.parent->ToHex(), " is not in the cache"));
    }
    parent = it->second.get();
  } else {
    parent = root;  // may be null: the namespace is new
  }
  const Hash128 parent_key = parent != nullptr ? parent->key : spec.ns;
  const int64_t parent_depth = parent != nullptr ? parent->depth : 0;
  const int64_t parent_tokens = parent_depth * spec.page_size;

  Hash128 key;
  if (cls == EntryClass::kPage) {
    if (parent_tokens + spec.page_size > options_.max_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("page ending at token ", parent_tokens + spec.page_size,
                                                     " is past max_tokens=", options_.max_tokens));
    }
    key = PageKey(parent_key, spec.tokens);
    if (auto it = pages_.find(key); it != pages_.end()) {
      if (!it->second->entry.committed) return absl::AbortedError("a put of this page is in flight");
      Reservation present{0, key, true, nullptr};
      present.model_cost_registered = RegisterModelCost(it->second->root, spec);
      UseNode(it->second.get(), now);
      return present;
    }
  } else {
    if (spec.position != parent_tokens + static_cast<int64_t>(spec.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat("state position ", spec.position, " disagrees with its parent (",
                                                     parent_depth, " pages of ", spec.page_size, ") and tail of ",
                                                     spec.tokens.size(), " tokens"));
    }
    key = StateKey(parent_key, spec.tokens);
    if (auto it = states_.find(key); it != states_.end()) {
      if (!it->second->entry.committed) return absl::AbortedError("a put of this state is in flight");
      Reservation present{0, key, true, nullptr};
      present.model_cost_registered = RegisterModelCost(it->second->node->root, spec);
      UseState(it->second.get(), now);
      ApplyRetention(it->second.get(), spec, &present);
      return present;
    }
  }

  if (parent == nullptr) {
    if (static_cast<int64_t>(roots_.size()) >= options_.max_namespaces) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the cache holds max_namespaces=", options_.max_namespaces, " namespaces"));
    }
    auto owned = std::make_unique<Node>();
    owned->key = spec.ns;
    owned->root = owned.get();
    owned->jump = owned.get();
    owned->page_size = spec.page_size;
    owned->tenant = spec.tenant;
    owned->entry.committed = true;
    root = parent = owned.get();
    roots_.emplace(spec.ns, std::move(owned));
  }

  // Keep the parent from being evicted to make room for its own child.
  parent->entry.pins++;
  RefreshNode(parent);
  const int64_t charge = Charge(spec);
  absl::Status room = MakeRoom(cls, charge);
  absl::StatusOr<std::shared_ptr<Blob>> blob =
      room.ok() ? blob_pool_->Acquire(static_cast<size_t>(spec.size_bytes)) : room;
  parent->entry.pins--;
  RefreshNode(parent);
  if (!blob.ok()) {
    // Nothing stays behind: eviction may have emptied the root while it was
    // pinned, or the root is the one this put created; either goes now.
    MaybeRemoveRoot(root);
    return blob.status();
  }

  Reservation r;
  r.id = next_id_++;
  r.key = key;
  r.blob = *std::move(blob);
  r.model_cost_registered = RegisterModelCost(root, spec);
  Entry entry;
  entry.cost = CostOf(*root);
  entry.size = spec.size_bytes;
  entry.charge = charge;
  entry.blob = r.blob;
  entry.reservation_id = r.id;
  entry.serial = r.id;
  ClassStats& counters = Counters(cls);
  counters.reserved_bytes += spec.size_bytes;
  counters.metadata_bytes += charge - spec.size_bytes;
  PendingPut& put = puts_[r.id];
  put = PendingPut{cls, key, absl::InfinitePast()};
  SetPutDeadline(r.id, put, now + options_.put_timeout);

  if (cls == EntryClass::kPage) {
    auto node = std::make_unique<Node>();
    node->key = key;
    node->parent = parent;
    node->root = root;
    node->depth = parent->depth + 1;
    // Skew-binary jump: two equal jumps above merge into one twice as long.
    Node* j = parent->jump;
    node->jump = (parent->depth - j->depth == j->depth - j->jump->depth) ? j->jump : parent;
    node->entry = std::move(entry);
    parent->children.push_back(node.get());
    RefreshNode(parent);
    pages_.emplace(key, std::move(node));
  } else {
    auto state = std::make_unique<State>();
    state->key = key;
    state->node = parent;
    state->tail = spec.tokens;
    state->position = spec.position;
    state->kind = spec.state_kind;
    state->entry = std::move(entry);
    state->slot = parent->states.size();
    parent->states.push_back(state.get());
    parent->tail_lengths[static_cast<int64_t>(spec.tokens.size())]++;
    parent->busy_states++;
    RefreshNode(parent);
    ApplyRetention(state.get(), spec, &r);
    states_.emplace(key, std::move(state));
  }
  return r;
}

absl::Status CacheIndex::Touch(uint64_t reservation_id, absl::Time now) {
  auto it = puts_.find(reservation_id);
  if (it == puts_.end()) {
    return absl::AbortedError("the put was reclaimed (timed out, or its parent page was removed)");
  }
  SetPutDeadline(reservation_id, it->second, now + options_.put_timeout);
  return absl::OkStatus();
}

absl::Status CacheIndex::Commit(uint64_t reservation_id, uint64_t checksum, absl::Time now) {
  auto it = puts_.find(reservation_id);
  if (it == puts_.end()) {
    return absl::AbortedError("the put was reclaimed (timed out, or its parent page was removed)");
  }
  const PendingPut put = it->second;
  put_deadlines_.erase({put.deadline, reservation_id});
  puts_.erase(it);
  ClassStats& counters = Counters(put.entry_class);
  Entry* e = nullptr;
  if (put.entry_class == EntryClass::kPage) {
    Node* node = pages_.at(put.key).get();
    e = &node->entry;
    e->committed = true;
    e->checksum = checksum;
    e->reservation_id = 0;
    RefreshNode(node);
    UseNode(node, now);
  } else {
    State* state = states_.at(put.key).get();
    e = &state->entry;
    e->committed = true;
    e->checksum = checksum;
    e->reservation_id = 0;
    // Reserved, it was busy; committed, it stays busy only when pinned.
    if (!IsBusy(*state)) state->node->busy_states--;
    RefreshNode(state->node);
    RefreshState(state);
    UseState(state, now);
  }
  counters.reserved_bytes -= e->size;
  counters.resident_bytes += e->size;
  counters.entries++;
  return absl::OkStatus();
}

void CacheIndex::Abort(uint64_t reservation_id) {
  auto it = puts_.find(reservation_id);
  if (it == puts_.end()) return;
  const PendingPut put = it->second;
  if (put.entry_class == EntryClass::kPage) {
    RemoveSubtree(pages_.at(put.key).get(), RemoveReason::kAborted);
  } else {
    RemoveState(states_.at(put.key).get(), RemoveReason::kAborted);
  }
}

absl::StatusOr<LookupResult> CacheIndex::Lookup(const Hash128& ns, int32_t page_size,
                                                absl::Span<const Hash128> page_keys, absl::Span<const TokenId> tokens,
                                                bool lease, absl::Time now, bool count) {
  if (static_cast<int64_t>(tokens.size()) > options_.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(tokens.size(), " tokens exceed max_tokens=", options_.max_tokens));
  }
  if (!IsValidPageSize(page_size)) return absl::InvalidArgumentError(PageSizeProblem(page_size));
  if (page_keys.size() != tokens.size() / page_size) {
    return absl::InvalidArgumentError("page keys do not match the tokens");
  }
  if (lease && static_cast<int64_t>(leases_.size()) >= options_.max_leases) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_leases=", options_.max_leases, " leases are open: release leases, or look up without one"));
  }
  if (count) totals_.lookups++;
  LookupResult result;
  auto root_it = roots_.find(ns);
  if (root_it == roots_.end()) return result;
  Node* root = root_it->second.get();
  if (root->page_size != page_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace uses page_size ", root->page_size, ", lookup says ", page_size));
  }

  // The chain of committed pages. A page exists only under its parent, so the
  // pages present are a prefix of the chain: binary search its end (log n
  // probes), then walk the parent links up from there instead of probing
  // every key.
  auto present = [&](size_t depth) -> Node* {
    auto it = pages_.find(page_keys[depth - 1]);
    if (it == pages_.end()) return nullptr;
    Node* n = it->second.get();
    return n->root == root && n->depth == static_cast<int64_t>(depth) ? n : nullptr;
  };
  size_t lo = 0, hi = page_keys.size() + 1;  // depth lo is present (0: the root), depth hi is not
  Node* deepest = root;
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (Node* n = present(mid)) {
      lo = mid;
      deepest = n;
    } else {
      hi = mid;
    }
  }
  std::vector<Node*> path(lo);
  for (Node* n = deepest; n != root; n = n->parent) path[n->depth - 1] = n;
  // Usable while committed from the root down.
  size_t committed = 0;
  while (committed < path.size() && path[committed]->entry.committed) ++committed;
  path.resize(committed);
  result.kv_match_tokens = static_cast<int64_t>(path.size()) * page_size;

  // The deepest node with a committed state whose tail matches the prompt.
  State* best = nullptr;
  for (int64_t depth = static_cast<int64_t>(path.size()); depth >= 0 && best == nullptr; --depth) {
    const Node* node = depth == 0 ? root : path[depth - 1];
    best = MatchState(*node, tokens.subspan(static_cast<size_t>(depth * page_size)));
  }
  for (Node* n : path) UseNode(n, now);
  if (best == nullptr) return result;

  const int64_t n_pages = best->node->depth;
  UseState(best, now);
  if (count) {
    totals_.lookup_hits++;
    (best->kind == StateKind::kGridCheckpoint ? totals_.hits_grid_checkpoint : totals_.hits_exact_prefix)++;
  }
  result.resume_position = best->position;
  result.pages.reserve(n_pages);
  for (int64_t i = 0; i < n_pages; ++i) result.pages.push_back(PageInfo(*path[i], page_size));
  result.state = StateInfo(*best);

  if (lease) {
    const uint64_t id = next_id_++;
    Lease& l = leases_[id];
    l.expiry = absl::InfinitePast();
    if (n_pages > 0) l.deepest = Held{EntryClass::kPage, path[n_pages - 1]->key, path[n_pages - 1]->entry.serial};
    l.state = Held{EntryClass::kState, best->key, best->entry.serial};
    PinLease(l, +1);
    SetLeaseExpiry(id, l, now + options_.lease_ttl);
    result.lease_id = id;
    result.lease_expiry = l.expiry;
  }
  return result;
}

void CacheIndex::CountLookup(const LookupResult& result) {
  totals_.lookups++;
  if (!result.state.has_value()) return;
  totals_.lookup_hits++;
  (result.state->state_kind == StateKind::kGridCheckpoint ? totals_.hits_grid_checkpoint : totals_.hits_exact_prefix)++;
}

CacheIndex::State* CacheIndex::MatchState(const Node& node, absl::Span<const TokenId> rest) const {
  if (node.tail_lengths.empty()) return nullptr;
  // The key of each stored tail length's prefix of `rest`, from one pass of
  // the hash over the longest: StateKey(node, rest[0, L)) for every L present.
  common::ChainHasher hasher(StateParentKey(node.key));
  std::vector<std::pair<int64_t, Hash128>> candidates;
  int64_t hashed = 0;
  for (const auto& [length, count] : node.tail_lengths) {
    if (length > static_cast<int64_t>(rest.size())) break;
    hasher.Update(rest.data() + hashed, static_cast<size_t>(length - hashed) * sizeof(TokenId));
    hashed = length;
    candidates.emplace_back(length, hasher.Digest());
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    auto found = states_.find(it->second);
    if (found == states_.end()) continue;
    State* s = found->second.get();
    // The key decides; the tail is compared too, so that not even a 128-bit
    // collision serves another prompt's state.
    if (!s->entry.committed || s->node != &node || static_cast<int64_t>(s->tail.size()) != it->first ||
        !std::equal(s->tail.begin(), s->tail.end(), rest.begin())) {
      continue;
    }
    return s;
  }
  return nullptr;
}

void CacheIndex::RemoveCorrupt(EntryClass entry_class, const Hash128& key) {
  if (entry_class == EntryClass::kPage) {
    auto it = pages_.find(key);
    if (it == pages_.end()) return;
    totals_.checksum_failures++;
    RemoveSubtree(it->second.get(), RemoveReason::kCorrupt);
  } else {
    auto it = states_.find(key);
    if (it == states_.end()) return;
    totals_.checksum_failures++;
    RemoveState(it->second.get(), RemoveReason::kCorrupt);
  }
}

IndexStats CacheIndex::Stats() const {
  IndexStats s = totals_;
  s.pages = page_stats_;
  s.states = state_stats_;
  s.namespaces = static_cast<int64_t>(roots_.size());
  s.namespaces_with_model_cost = roots_with_model_cost_;
  s.active_leases = static_cast<int64_t>(leases_.size());
  s.active_puts = static_cast<int64_t>(puts_.size());
  s.pinned_states = pinned_states_;
  s.pinned_bytes = pinned_bytes_;
  return s;
}

std::optional<PrefillCost> CacheIndex::ModelCostOf(const Hash128& ns) const {
  auto it = roots_.find(ns);
  return it == roots_.end() ? std::nullopt : it->second->model_cost;
}

PrefillCost CacheIndex::CostOf(const Node& root) const {
  return root.model_cost.value_or(
      PrefillCost{options_.utility.flops_per_token, options_.utility.flops_per_token_context});
}

bool CacheIndex::RegisterModelCost(Node* root, const PutSpec& spec) {
  if (!spec.model_cost.has_value() || root->model_cost == spec.model_cost) return false;
  if (!root->model_cost.has_value()) roots_with_model_cost_++;
  root->model_cost = spec.model_cost;
  return true;
}

bool CacheIndex::Contains(EntryClass entry_class, const Hash128& key) const {
  return entry_class == EntryClass::kPage ? pages_.contains(key) : states_.contains(key);
}

void CacheIndex::SetPutDeadline(uint64_t reservation_id, PendingPut& put, absl::Time deadline) {
  put_deadlines_.erase({put.deadline, reservation_id});
  put.deadline = deadline;
  put_deadlines_.insert({deadline, reservation_id});
}

EntryInfo CacheIndex::PageInfo(const Node& n, int32_t page_size) {
  EntryInfo info;
  info.key = n.key;
  info.entry_class = EntryClass::kPage;
  info.size_bytes = n.entry.size;
  info.checksum = n.entry.checksum;
  info.position = n.depth * page_size;
  return info;
}

EntryInfo CacheIndex::StateInfo(const State& s) {
  EntryInfo info;
  info.key = s.key;
  info.entry_class = EntryClass::kState;
  info.size_bytes = s.entry.size;
  info.checksum = s.entry.checksum;
  info.state_kind = s.kind;
  info.position = s.position;
  return info;
}

}  // namespace hybridserve::cachestore
