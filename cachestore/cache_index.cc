#include "cachestore/cache_index.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tokens.h"

namespace hybridserve::cachestore {
CacheIndex::CacheIndex(const CacheIndexOptions& options)
    : options_(options),
      // Free buffers are outside the budgets: at most an eighth of them.
      blob_pool_(BlobPool::Create(
          std::min(options.blob_pool_bytes, options.page_budget_bytes / 8 + options.state_budget_bytes / 8))) {
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
      UseNode(it->second.get(), now);
      return Reservation{0, key, true, nullptr};
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
      UseState(it->second.get(), now);
      Reservation present{0, key, true, nullptr};
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
  Entry entry;
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

absl::Status CacheIndex::MakeRoom(EntryClass c, int64_t charge) {
  ClassStats& counters = Counters(c);
  while (counters.resident_bytes + counters.reserved_bytes + counters.metadata_bytes + charge > Budget(c)) {
    if (c == EntryClass::kPage) {
      if (page_lru_.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "page budget of ", Budget(c), " bytes is held by leased, pinned, in-flight or interior pages"));
      }
      RemoveNodeOnly(page_lru_.begin()->second, RemoveReason::kLru);
    } else {
      if (state_lru_.empty() && session_lru_.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("state budget of ", Budget(c), " bytes is held by leased, pinned or in-flight states"));
      }
      // The least recently used of both sets.
      const bool session =
          state_lru_.empty() || (!session_lru_.empty() && session_lru_.begin()->first < state_lru_.begin()->first);
      RemoveState((session ? session_lru_ : state_lru_).begin()->second, RemoveReason::kLru);
    }
  }
  return absl::OkStatus();
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
                                                bool lease, absl::Time now) {
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
  totals_.lookups++;
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
  totals_.lookup_hits++;
  (best->kind == StateKind::kGridCheckpoint ? totals_.hits_grid_checkpoint : totals_.hits_exact_prefix)++;
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

absl::StatusOr<ReadHandle> CacheIndex::Open(uint64_t lease_id, const Hash128& key, absl::Time now) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.expiry < now) {
    return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  }
  Lease& lease = it->second;
  const Held* held = nullptr;
  if (key == lease.state.key) {
    held = &lease.state;
  } else if (lease.deepest.has_value()) {
    // A page of the lease is the deepest page or one of its ancestors.
    const Entry* deepest = HeldEntry(EntryClass::kPage, lease.deepest->key, lease.deepest->serial);
    if (deepest == nullptr) {
      // Without a page list the lease cannot tell its own pages from others
      // now: any page read through it extends it, as a read of its pages would.
      SetLeaseExpiry(lease_id, lease, now + options_.lease_ttl);
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, "'s pages were removed (failed verification)"));
    }
    const Node* last = pages_.at(lease.deepest->key).get();
    auto p = pages_.find(key);
    if (p != pages_.end() && p->second->root == last->root && p->second->depth <= last->depth &&
        LevelAncestor(last, p->second->depth) == p->second.get()) {
      held = &*lease.deepest;  // a page of the lease lives as long as its deepest page
    }
  }
  if (held == nullptr) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " does not hold entry ", key.ToHex()));
  }
  SetLeaseExpiry(lease_id, lease, now + options_.lease_ttl);
  if (HeldEntry(held->entry_class, held->key, held->serial) == nullptr) {
    return absl::NotFoundError("entry was removed (failed verification)");
  }
  ReadHandle h;
  if (held->entry_class == EntryClass::kPage) {
    const Node& n = *pages_.at(key);
    h.info = PageInfo(n, n.root->page_size);
    h.blob = n.entry.blob;
  } else {
    const State& st = *states_.at(key);
    h.info = StateInfo(st);
    h.blob = st.entry.blob;
  }
  return h;
}

absl::Status CacheIndex::Release(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("unknown or expired lease ", lease_id));
  ReleaseLeaseEntries(it->second);
  lease_expiry_.erase({it->second.expiry, lease_id});
  leases_.erase(it);
  return absl::OkStatus();
}

void CacheIndex::ReleaseLeaseEntries(const Lease& lease) { PinLease(lease, -1); }

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

IndexStats CacheIndex::Stats() const {
  IndexStats s = totals_;
  s.pages = page_stats_;
  s.states = state_stats_;
  s.namespaces = static_cast<int64_t>(roots_.size());
  s.active_leases = static_cast<int64_t>(leases_.size());
  s.active_puts = static_cast<int64_t>(puts_.size());
  s.pinned_states = pinned_states_;
  s.pinned_bytes = pinned_bytes_;
  return s;
}

bool CacheIndex::Contains(EntryClass entry_class, const Hash128& key) const {
  return entry_class == EntryClass::kPage ? pages_.contains(key) : states_.contains(key);
}

// --- LRU bookkeeping -------------------------------------------------------

void CacheIndex::UseNode(Node* node, absl::Time now) {
  if (node->parent == nullptr) return;
  const bool was = node->entry.evictable;
  if (was) page_lru_.erase({node->entry.tick, node});
  node->entry.tick = next_tick_++;
  node->entry.last_use = now;
  if (was) page_lru_.insert({node->entry.tick, node});
}

void CacheIndex::UseState(State* state, absl::Time now) {
  const bool was = state->entry.evictable;
  if (was) StateLru(*state).erase({state->entry.tick, state});
  state->entry.tick = next_tick_++;
  state->entry.last_use = now;
  if (was) StateLru(*state).insert({state->entry.tick, state});
  RefreshExpiry(state);
}

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
    Node* root = state->node->root;
    const int64_t size = state->entry.size;
    if (root->pinned_bytes + size > options_.pin_quota_bytes) {
      r->pin_refused = absl::StrCat("the namespace's pin quota of ", options_.pin_quota_bytes, " bytes is used (",
                                    root->pinned_bytes, " pinned, this state ", size, ")");
    } else if (pinned_bytes_ + size > PinBudget()) {
      r->pin_refused = absl::StrCat("the cache's pin budget of ", PinBudget(), " bytes is used (", pinned_bytes_,
                                    " pinned, this state ", size, ")");
    } else {
      const bool was_busy = IsBusy(*state);
      state->session_pin = true;
      root->pinned_bytes += size;
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

void CacheIndex::RefreshNode(Node* node) {
  if (node->parent == nullptr) return;  // roots hold no bytes
  Entry& e = node->entry;
  const bool evictable = e.committed && e.pins == 0 && node->children.empty() && node->busy_states == 0;
  if (evictable == e.evictable) return;
  if (evictable) {
    page_lru_.insert({e.tick, node});
  } else {
    page_lru_.erase({e.tick, node});
  }
  e.evictable = evictable;
}

void CacheIndex::RefreshState(State* state) {
  Entry& e = state->entry;
  const bool evictable = !IsBusy(*state);
  if (evictable == e.evictable) return;
  if (evictable) {
    StateLru(*state).insert({e.tick, state});
  } else {
    StateLru(*state).erase({e.tick, state});
  }
  e.evictable = evictable;
}

CacheIndex::Entry* CacheIndex::HeldEntry(EntryClass c, const Hash128& key, uint64_t serial) {
  Entry* e = nullptr;
  if (c == EntryClass::kPage) {
    if (auto it = pages_.find(key); it != pages_.end()) e = &it->second->entry;
  } else {
    if (auto it = states_.find(key); it != states_.end()) e = &it->second->entry;
  }
  return e != nullptr && e->serial == serial ? e : nullptr;
}

void CacheIndex::PinLease(const Lease& lease, int delta) {
  if (lease.deepest.has_value()) Pin(lease.deepest->entry_class, lease.deepest->key, lease.deepest->serial, delta);
  Pin(lease.state.entry_class, lease.state.key, lease.state.serial, delta);
}

void CacheIndex::Pin(EntryClass c, const Hash128& key, uint64_t serial, int delta) {
  if (HeldEntry(c, key, serial) == nullptr) return;  // removed after failing verification
  if (c == EntryClass::kPage) {
    Node* n = pages_.at(key).get();
    n->entry.pins += delta;
    RefreshNode(n);
  } else {
    State* s = states_.at(key).get();
    const bool was_busy = IsBusy(*s);
    s->entry.pins += delta;
    const bool busy = IsBusy(*s);
    if (was_busy != busy) {
      s->node->busy_states += busy ? 1 : -1;
      RefreshNode(s->node);
    }
    RefreshState(s);
  }
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
  ClassStats& counters = state_stats_;
  if (reason == RemoveReason::kLru) counters.evicted_lru++;
  if (reason == RemoveReason::kTtl) counters.evicted_ttl++;
  if (reason == RemoveReason::kWithPages && state->entry.committed) counters.dropped_with_pages++;
  if (state->entry.evictable) StateLru(*state).erase({state->entry.tick, state});
  if (state->expiry != absl::InfiniteFuture()) session_expiry_.erase({state->expiry, state});
  Node* node = state->node;
  if (state->session_pin) {
    node->root->pinned_bytes -= state->entry.size;
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
  if (node->parent == nullptr) {
    MaybeRemoveRoot(node);
  } else {
    RefreshNode(node);
  }
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
  while (!node->states.empty()) RemoveState(node->states.back(), RemoveReason::kWithPages);
  if (reason == RemoveReason::kLru) page_stats_.evicted_lru++;
  if (reason == RemoveReason::kTtl) page_stats_.evicted_ttl++;
  if (reason == RemoveReason::kWithPages && node->entry.committed) page_stats_.dropped_with_pages++;
  if (node->entry.evictable) page_lru_.erase({node->entry.tick, node});
  ForgetEntryBytes(EntryClass::kPage, &node->entry);
  Node* parent = node->parent;
  auto& siblings = parent->children;
  siblings.erase(std::find(siblings.begin(), siblings.end(), node));
  pages_.erase(node->key);  // destroys *node
  if (parent->parent == nullptr) {
    MaybeRemoveRoot(parent);
  } else {
    RefreshNode(parent);
  }
}

void CacheIndex::MaybeRemoveRoot(Node* root) {
  // A pinned root is in use by a Reserve that is making room under it.
  if (root->entry.pins == 0 && root->children.empty() && root->states.empty()) roots_.erase(root->key);
}

const CacheIndex::Node* CacheIndex::LevelAncestor(const Node* node, int64_t depth) {
  while (node->depth > depth) node = node->jump->depth >= depth ? node->jump : node->parent;
  return node;
}

void CacheIndex::SetLeaseExpiry(uint64_t lease_id, Lease& lease, absl::Time expiry) {
  lease_expiry_.erase({lease.expiry, lease_id});
  lease.expiry = expiry;
  lease_expiry_.insert({expiry, lease_id});
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

// --- Invariants ------------------------------------------------------------

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
  absl::flat_hash_map<const Node*, int64_t> pinned_by_root;
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
    evictable_pages += evictable ? 1 : 0;
  }
  for (const auto& [key, root] : roots_) {
    if (root->children.empty() && root->states.empty()) return fail("empty root kept");
    if (root->jump != root.get()) return fail("root jump pointer is not itself");
    RETURN_IF_ERROR(CheckStateSlots(*root));
    int busy = 0;
    for (const State* s : root->states) busy += IsBusy(*s) ? 1 : 0;
    if (busy != root->busy_states) return fail("root busy_states out of date");
  }
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
    evictable_states += evictable ? 1 : 0;
    if (s->session_pin) {
      pinned_bytes += e.size;
      pinned_states++;
      pinned_by_root[s->node->root] += e.size;
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
  for (const auto& [key, root] : roots_) {
    if (root->pinned_bytes != pinned_by_root[root.get()]) return fail("namespace pin accounting drifted");
    if (root->pinned_bytes > options_.pin_quota_bytes) return fail("namespace pin quota exceeded");
  }
  if (pinned_bytes_ > PinBudget()) return fail("pin budget exceeded");
  if (evictable_pages != page_lru_.size() || evictable_states != state_lru_.size() + session_lru_.size()) {
    return fail("LRU sets hold removed entries");
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
