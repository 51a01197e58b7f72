#ifndef HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_REFERENCE_MODEL_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_REFERENCE_MODEL_H_

// A naive, obviously-correct re-implementation of the cache semantics of
// docs/ARCHITECTURE.md section 4 over a flat vector of entries (O(n) scans for
// everything), the oracle of cache_index_random_test. Test-only.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/index/cache_index.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore::reference {

constexpr int kNamespaces = 2;
constexpr int kMaxPromptTokens = 16;
constexpr TokenId kAlphabet = 3;  // tokens 0..2: prefixes and keys collide often
constexpr size_t kHistory = 40;   // operations printed with a failure

// Model time: integer milliseconds after kT0, so that random advances can land
// exactly on deadlines, lease expiries and TTL boundaries.
const absl::Time kT0 = absl::FromUnixSeconds(1000);
inline absl::Time At(int64_t ms) { return kT0 + absl::Milliseconds(ms); }

using Tokens = std::vector<TokenId>;
using EntryRef = std::pair<EntryClass, Hash128>;

inline std::string Str(const Tokens& t) { return absl::StrCat("[", absl::StrJoin(t, ","), "]"); }
inline const char* ClassName(EntryClass c) { return c == EntryClass::kPage ? "page" : "state"; }

inline bool StartsWith(const Tokens& v, const Tokens& prefix) {
  return v.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

inline Tokens Head(const Tokens& v, size_t n) { return Tokens(v.begin(), v.begin() + std::min(n, v.size())); }

inline bool ValidPageSize(int64_t ps) { return ps > 0 && ps <= (1 << 16) && (ps & (ps - 1)) == 0; }

// Keys of stored prefixes, from keys.h (the interface the index is keyed by).
inline Hash128 PageKeyOf(const Hash128& ns, const Tokens& prefix, int32_t page_size) {
  return PageKeys(ns, prefix, page_size).back();
}

inline Hash128 StateKeyOf(const Hash128& ns, const Tokens& prefix, int32_t page_size) {
  const size_t n = prefix.size() / page_size;
  const Hash128 parent = n == 0 ? ns : PageKeyOf(ns, Head(prefix, n * page_size), page_size);
  return StateKey(parent, absl::MakeConstSpan(prefix).subspan(n * page_size));
}

struct Config {
  int32_t default_page_size[kNamespaces] = {4, 4};
  int64_t page_budget = 0;
  int64_t state_budget = 0;
  std::optional<int64_t> page_ttl;   // ms; nullopt: entries never expire
  std::optional<int64_t> state_ttl;  // ms; nullopt: entries never expire
  int64_t lease_ttl = 0;             // ms
  int64_t put_timeout = 0;           // ms
  int64_t max_tokens = 0;
  int64_t entry_overhead = 0;  // CacheIndexOptions::entry_overhead_bytes
  // CacheIndexOptions::eviction and ::utility: GreedyDual-Size by utility
  // (eviction_utility.h), the model's own selection over the same arithmetic.
  bool utility = false;
  UtilityCost utility_cost;

  CacheIndexOptions ToOptions() const {
    CacheIndexOptions o;
    o.page_budget_bytes = page_budget;
    o.state_budget_bytes = state_budget;
    o.page_ttl = page_ttl ? absl::Milliseconds(*page_ttl) : absl::InfiniteDuration();
    o.state_ttl = state_ttl ? absl::Milliseconds(*state_ttl) : absl::InfiniteDuration();
    o.lease_ttl = absl::Milliseconds(lease_ttl);
    o.put_timeout = absl::Milliseconds(put_timeout);
    o.max_tokens = max_tokens;
    o.entry_overhead_bytes = entry_overhead;
    if (utility) {
      o.eviction = EvictionPolicy::kUtility;
      o.utility = utility_cost;
    }
    return o;
  }

  std::string Describe() const {
    auto ttl = [](const std::optional<int64_t>& t) { return t ? absl::StrCat(*t, "ms") : std::string("inf"); };
    return absl::StrCat("page_size=", default_page_size[0], "/", default_page_size[1], " page_budget=", page_budget,
                        " state_budget=", state_budget, " page_ttl=", ttl(page_ttl), " state_ttl=", ttl(state_ttl),
                        " lease_ttl=", lease_ttl, "ms put_timeout=", put_timeout, "ms max_tokens=", max_tokens,
                        " entry_overhead=", entry_overhead,
                        utility ? absl::StrCat(" eviction=utility flops_per_token=", utility_cost.flops_per_token,
                                               " flops_per_token_context=", utility_cost.flops_per_token_context,
                                               " recency_blend=", utility_cost.recency_blend)
                                : std::string(" eviction=lru"));
  }
};

// ---------------------------------------------------------------------------
// The reference model.

struct ModelEntry {
  EntryClass cls = EntryClass::kPage;
  int ns = 0;
  int32_t page_size = 0;  // of its namespace
  // Pages: tokens [0, depth * page_size). States: tokens [0, p).
  Tokens prefix;
  Hash128 key;
  StateKind kind = StateKind::kExactPrefix;  // states only
  int64_t size = 0;
  int64_t charge = 0;  // against the budget: size, the entry overhead, a state's tail at 4 bytes a token
  bool committed = false;
  uint64_t checksum = 0;
  int pins = 0;
  uint64_t use_order = 0;  // larger: used more recently
  int64_t last_use = 0;
  double base = 0;              // utility: the class clock at the last use
  PrefillCost cost;             // utility: its namespace's cost at the last use (CostOf)
  int64_t deadline = 0;         // reserved entries
  uint64_t reservation_id = 0;  // reserved entries
  uint64_t serial = 0;          // tells apart entries stored again under the same key

  // Pages: their depth. States: the depth of the node they hang from.
  size_t NodeDepth() const { return prefix.size() / page_size; }

  EntryInfo Info() const {
    EntryInfo info;
    info.key = key;
    info.entry_class = cls;
    info.size_bytes = size;
    info.checksum = checksum;
    if (cls == EntryClass::kState) info.state_kind = kind;
    info.position = static_cast<int64_t>(prefix.size());
    return info;
  }
};

// An entry a lease pinned. A lease holds that entry, not its key: once the
// entry is removed as corrupt, a later entry with the same key is not held.
struct HeldEntry {
  EntryClass cls = EntryClass::kPage;
  Hash128 key;
  uint64_t serial = 0;
};

// A lease's pages live as long as its deepest page: once that is removed
// (as corrupt, with an ancestor or itself), the lease's pages are void and
// unpinned, though entries above the removal may remain in the cache.
struct ModelLease {
  int64_t expiry = 0;
  std::vector<HeldEntry> entries;  // pages in order, then the state
  bool pages_void = false;

  const HeldEntry* Deepest() const {
    const HeldEntry* d = nullptr;
    for (const HeldEntry& h : entries) {
      if (h.cls == EntryClass::kPage) d = &h;
    }
    return d;
  }
};

struct ModelClassCounters {
  int64_t evicted_lru = 0;
  int64_t evicted_ttl = 0;
  int64_t dropped_with_pages = 0;
};

// A put, as the generator describes it. `parent` is the key sent to the index.
struct PutRequest {
  EntryClass cls = EntryClass::kPage;
  int ns = 0;
  int32_t page_size = 0;
  std::optional<Hash128> parent;
  std::string parent_desc = "root";
  Tokens tokens;
  StateKind kind = StateKind::kExactPrefix;
  int64_t position = 0;
  int64_t size = 0;
  std::optional<PrefillCost> model_cost;  // PutSpec::model_cost

  std::string Describe() const {
    return absl::StrCat(
        "Reserve ", ClassName(cls), " ns=", ns, " ps=", page_size, " parent=", parent_desc, " tokens=", Str(tokens),
        cls == EntryClass::kState
            ? absl::StrCat(" p=", position, kind == StateKind::kGridCheckpoint ? " grid" : " exact")
            : std::string(),
        " size=", size,
        model_cost.has_value()
            ? absl::StrCat(" cost=", model_cost->flops_per_token, "+", model_cost->flops_per_token_context, "/ctx")
            : std::string());
  }
};

struct ReserveOutcome {
  absl::StatusCode code = absl::StatusCode::kOk;
  bool already_present = false;
  Hash128 key;
  int created = -1;  // index of the new model entry
  bool model_cost_registered = false;
};

struct LookupOutcome {
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t resume_position = 0;
  int64_t kv_match_tokens = 0;
  std::vector<EntryInfo> pages;
  std::optional<EntryInfo> state;
  std::vector<HeldEntry> lease_entries;  // empty: nothing to lease
};

struct ExpireOutcome {
  std::vector<uint64_t> reclaimed;  // sorted
  // How many reclaimed puts were still present when their turn came depends
  // on the order in which the index visits them (a timed-out page takes its
  // timed-out descendants with it); these bound it.
  int64_t min_expired_puts = 0;
  int64_t max_expired_puts = 0;
};

// Naive and single-threaded: every question is a scan over `entries_`.
class ReferenceModel {
 public:
  ReferenceModel(const Config& config, const Hash128* ns_keys) : config_(config) {
    for (int i = 0; i < kNamespaces; ++i) ns_keys_[i] = ns_keys[i];
  }

  const std::vector<ModelEntry>& entries() const { return entries_; }
  const std::map<uint64_t, ModelLease>& leases() const { return leases_; }
  const std::deque<ModelEntry>& graveyard() const { return graveyard_; }
  const std::string& error() const { return error_; }
  const ModelClassCounters& counters(EntryClass c) const { return counters_[static_cast<int>(c)]; }
  int64_t lookups() const { return lookups_; }
  int64_t lookup_hits() const { return lookup_hits_; }
  int64_t hits_grid() const { return hits_grid_; }
  int64_t hits_exact() const { return hits_exact_; }
  int64_t expired_leases() const { return expired_leases_; }
  int64_t checksum_failures() const { return checksum_failures_; }

  int64_t Budget(EntryClass c) const { return c == EntryClass::kPage ? config_.page_budget : config_.state_budget; }

  // Bytes (or entries) of class `c` that are committed / reserved.
  int64_t Bytes(EntryClass c, bool committed) const {
    int64_t sum = 0;
    for (const ModelEntry& e : entries_) sum += e.cls == c && e.committed == committed ? e.size : 0;
    return sum;
  }
  // Index memory of class `c`'s entries, committed and reserved.
  int64_t Metadata(EntryClass c) const {
    int64_t sum = 0;
    for (const ModelEntry& e : entries_) sum += e.cls == c ? e.charge - e.size : 0;
    return sum;
  }
  int64_t Count(EntryClass c, bool committed) const {
    int64_t n = 0;
    for (const ModelEntry& e : entries_) n += e.cls == c && e.committed == committed ? 1 : 0;
    return n;
  }
  int64_t Reserved() const { return Count(EntryClass::kPage, false) + Count(EntryClass::kState, false); }

  // The page size of a namespace's stored entries; nullopt when it has none.
  std::optional<int32_t> NamespacePageSize(int ns) const {
    for (const ModelEntry& e : entries_) {
      if (e.ns == ns) return e.page_size;
    }
    return std::nullopt;
  }
  int64_t Namespaces() const {
    int64_t n = 0;
    for (int ns = 0; ns < kNamespaces; ++ns) n += NamespacePageSize(ns).has_value() ? 1 : 0;
    return n;
  }
  // The model cost a namespace registered; nullopt when it has none or no
  // entries (an emptied namespace forgets it, as the index drops its root).
  std::optional<PrefillCost> ModelCostOf(int ns) const {
    return NamespacePageSize(ns).has_value() ? ns_cost_[ns] : std::nullopt;
  }
  int64_t NamespacesWithModelCost() const {
    int64_t n = 0;
    for (int ns = 0; ns < kNamespaces; ++ns) n += ModelCostOf(ns).has_value() ? 1 : 0;
    return n;
  }

  int FindByKey(EntryClass c, const Hash128& key) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].cls == c && entries_[i].key == key) return static_cast<int>(i);
    }
    return -1;
  }

  // The entry a lease pinned, if it is still stored; -1 after it was removed.
  int FindHeld(const HeldEntry& h) const {
    const int i = FindByKey(h.cls, h.key);
    return i >= 0 && entries_[i].serial == h.serial ? i : -1;
  }

  ReserveOutcome Reserve(const PutRequest& req, int64_t now) {
    ReserveOutcome out;
    auto fail = [&out](absl::StatusCode code) {
      out.code = code;
      return out;
    };
    const bool is_page = req.cls == EntryClass::kPage;
    const int64_t ps = req.page_size;
    // Only a put creates a namespace: one that emptied since the last put
    // (the index dropped its root) starts again without a cost. Not during
    // this put's own evictions: the index keeps the root pinned through them.
    for (int ns = 0; ns < kNamespaces; ++ns) {
      if (!NamespacePageSize(ns).has_value()) ns_cost_[ns].reset();
    }
    // Validation of the spec alone.
    if (!ValidPageSize(ps)) return fail(absl::StatusCode::kInvalidArgument);
    // A page may be empty (a model without attention layers); a state may not.
    if (req.size < 0 || (req.size == 0 && !is_page)) return fail(absl::StatusCode::kInvalidArgument);
    for (TokenId t : req.tokens) {
      if (t < 0) return fail(absl::StatusCode::kInvalidArgument);
    }
    if (is_page && static_cast<int64_t>(req.tokens.size()) != ps) return fail(absl::StatusCode::kInvalidArgument);
    if (!is_page) {
      if (static_cast<int64_t>(req.tokens.size()) >= ps) return fail(absl::StatusCode::kInvalidArgument);
      if (req.position <= 0 || req.position > config_.max_tokens) return fail(absl::StatusCode::kInvalidArgument);
    }
    if (req.model_cost.has_value() && !PrefillCostProblem(*req.model_cost).empty()) {
      return fail(absl::StatusCode::kInvalidArgument);
    }
    const int64_t charge =
        req.size + config_.entry_overhead + (is_page ? 0 : static_cast<int64_t>(req.tokens.size()) * 4);
    if (charge > Budget(req.cls)) return fail(absl::StatusCode::kResourceExhausted);
    // The namespace's page size.
    if (auto ns_ps = NamespacePageSize(req.ns); ns_ps.has_value() && *ns_ps != ps) {
      return fail(absl::StatusCode::kInvalidArgument);
    }
    // The parent: a stored (committed or reserved) page of the same namespace.
    Tokens full;
    if (req.parent.has_value()) {
      const int parent = FindByKey(EntryClass::kPage, *req.parent);
      if (parent < 0 || entries_[parent].ns != req.ns) return fail(absl::StatusCode::kFailedPrecondition);
      full = entries_[parent].prefix;
    }
    const int64_t parent_tokens = static_cast<int64_t>(full.size());
    full.insert(full.end(), req.tokens.begin(), req.tokens.end());
    if (is_page && parent_tokens + ps > config_.max_tokens) return fail(absl::StatusCode::kInvalidArgument);
    if (!is_page && req.position != static_cast<int64_t>(full.size())) {
      return fail(absl::StatusCode::kInvalidArgument);
    }
    // The same entry again.
    for (ModelEntry& e : entries_) {
      if (e.cls != req.cls || e.ns != req.ns || e.prefix != full) continue;
      if (!e.committed) return fail(absl::StatusCode::kAborted);
      out.model_cost_registered = RegisterModelCost(req);
      Use(e, now);
      out.already_present = true;
      out.key = e.key;
      return out;
    }
    // Room, with the parent page pinned so that it is not evicted for its child.
    if (req.parent.has_value()) entries_[FindByKey(EntryClass::kPage, *req.parent)].pins++;
    const bool room = MakeRoom(req.cls, charge);
    if (req.parent.has_value()) entries_[FindByKey(EntryClass::kPage, *req.parent)].pins--;
    if (!room) return fail(absl::StatusCode::kResourceExhausted);
    out.model_cost_registered = RegisterModelCost(req);

    ModelEntry e;
    e.cost = CostOf(req.ns);
    e.cls = req.cls;
    e.ns = req.ns;
    e.page_size = req.page_size;
    e.prefix = full;
    e.key =
        is_page ? PageKeyOf(ns_keys_[req.ns], full, req.page_size) : StateKeyOf(ns_keys_[req.ns], full, req.page_size);
    if (!is_page) e.kind = req.kind;
    e.size = req.size;
    e.charge = charge;
    e.deadline = now + config_.put_timeout;
    e.serial = ++serial_counter_;
    entries_.push_back(e);
    out.key = e.key;
    out.created = static_cast<int>(entries_.size()) - 1;
    return out;
  }

  void SetReservationId(int entry, uint64_t id) { entries_[entry].reservation_id = id; }

  absl::StatusCode Commit(uint64_t id, uint64_t checksum, int64_t now) {
    const int i = FindReservation(id);
    if (i < 0) return absl::StatusCode::kAborted;
    ModelEntry& e = entries_[i];
    e.committed = true;
    e.checksum = checksum;
    e.reservation_id = 0;
    Use(e, now);
    return absl::StatusCode::kOk;
  }

  absl::StatusCode Touch(uint64_t id, int64_t now) {
    const int i = FindReservation(id);
    if (i < 0) return absl::StatusCode::kAborted;
    entries_[i].deadline = now + config_.put_timeout;
    return absl::StatusCode::kOk;
  }

  void Abort(uint64_t id) {
    const int i = FindReservation(id);
    if (i >= 0) AbortEntry(i);
  }

  LookupOutcome Lookup(int ns, int32_t ps, size_t n_page_keys, const Tokens& tokens, bool lease, int64_t now) {
    LookupOutcome out;
    if (static_cast<int64_t>(tokens.size()) > config_.max_tokens || !ValidPageSize(ps) ||
        n_page_keys != tokens.size() / ps) {
      out.code = absl::StatusCode::kInvalidArgument;
      return out;
    }
    lookups_++;
    const std::optional<int32_t> ns_ps = NamespacePageSize(ns);
    if (!ns_ps.has_value()) return out;
    if (*ns_ps != ps) {
      out.code = absl::StatusCode::kInvalidArgument;
      return out;
    }
    // The chain of committed pages along the prompt.
    std::vector<int> path;
    for (size_t d = 1; d * ps <= tokens.size(); ++d) {
      const int page = Find(EntryClass::kPage, ns, Head(tokens, d * ps));
      if (page < 0 || !entries_[page].committed) break;
      path.push_back(page);
    }
    out.kv_match_tokens = static_cast<int64_t>(path.size()) * ps;
    // From the deepest matched node up: the longest committed state that the
    // prompt continues.
    int best = -1;
    for (int64_t depth = static_cast<int64_t>(path.size()); depth >= 0 && best < 0; --depth) {
      for (size_t i = 0; i < entries_.size(); ++i) {
        const ModelEntry& s = entries_[i];
        if (s.cls != EntryClass::kState || s.ns != ns || !s.committed) continue;
        if (static_cast<int64_t>(s.NodeDepth()) != depth || !StartsWith(tokens, s.prefix)) continue;
        if (best < 0 || s.prefix.size() > entries_[best].prefix.size()) best = static_cast<int>(i);
      }
    }
    for (int page : path) Use(entries_[page], now);
    if (best < 0) return out;
    ModelEntry& state = entries_[best];
    Use(state, now);
    lookup_hits_++;
    (state.kind == StateKind::kGridCheckpoint ? hits_grid_ : hits_exact_)++;
    out.resume_position = static_cast<int64_t>(state.prefix.size());
    for (size_t i = 0; i < state.NodeDepth(); ++i) out.pages.push_back(entries_[path[i]].Info());
    out.state = state.Info();
    if (lease) {
      for (size_t i = 0; i < state.NodeDepth(); ++i) {
        out.lease_entries.push_back({EntryClass::kPage, entries_[path[i]].key, entries_[path[i]].serial});
      }
      out.lease_entries.push_back({EntryClass::kState, state.key, state.serial});
    }
    return out;
  }

  void AddLease(uint64_t id, int64_t now, const std::vector<HeldEntry>& held) {
    ModelLease& l = leases_[id];
    l.expiry = now + config_.lease_ttl;
    l.entries = held;
    Pin(l, +1);
  }

  absl::StatusCode Release(uint64_t id) {
    auto it = leases_.find(id);
    if (it == leases_.end()) return absl::StatusCode::kNotFound;
    Pin(it->second, -1);
    leases_.erase(it);
    return absl::StatusCode::kOk;
  }

  // A read under a lease extends it, even when the entry it asks for was
  // removed as corrupt since (NOT_FOUND).
  absl::StatusCode Open(uint64_t id, const Hash128& key, int64_t now, EntryInfo* info) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.expiry < now) return absl::StatusCode::kNotFound;
    // Once its pages are void (the deepest failed verification) a lease no
    // longer knows which pages were its own: any page key read through it
    // extends it and is NOT_FOUND (the index keeps no per-page list).
    if (it->second.pages_void) {
      bool is_state = false;
      for (const HeldEntry& h : it->second.entries) is_state |= h.cls == EntryClass::kState && h.key == key;
      if (!is_state) {
        it->second.expiry = now + config_.lease_ttl;
        return absl::StatusCode::kNotFound;
      }
    }
    for (const HeldEntry& h : it->second.entries) {
      if (h.key != key) continue;
      it->second.expiry = now + config_.lease_ttl;
      if (h.cls == EntryClass::kPage && it->second.pages_void) return absl::StatusCode::kNotFound;
      const int i = FindHeld(h);
      if (i < 0) return absl::StatusCode::kNotFound;
      *info = entries_[i].Info();
      return absl::StatusCode::kOk;
    }
    return absl::StatusCode::kNotFound;
  }

  // An entry whose bytes failed verification goes, leased or not, with every
  // entry that hangs from it.
  void RemoveCorrupt(EntryClass c, const Hash128& key) {
    const int i = FindByKey(c, key);
    if (i < 0) return;
    checksum_failures_++;
    const ModelEntry bad = entries_[i];
    std::vector<EntryRef> doomed = {{bad.cls, bad.key}};
    if (bad.cls == EntryClass::kPage) {
      for (const ModelEntry& e : entries_) {
        if (&e == &entries_[i] || !InSubtree(e, bad)) continue;
        if (e.committed) Counters(e.cls).dropped_with_pages++;
        doomed.emplace_back(e.cls, e.key);
      }
    }
    for (auto& [id, lease] : leases_) {
      const HeldEntry* deepest = lease.Deepest();
      if (lease.pages_void || deepest == nullptr || FindHeld(*deepest) < 0) continue;
      const bool hit = std::any_of(doomed.begin(), doomed.end(), [&](const EntryRef& r) {
        return r.first == EntryClass::kPage && r.second == deepest->key;
      });
      if (!hit) continue;
      for (const HeldEntry& h : lease.entries) {
        const int j = FindHeld(h);
        if (h.cls == EntryClass::kPage && j >= 0) entries_[j].pins--;
      }
      lease.pages_void = true;
    }
    Erase(doomed, /*corrupt=*/true);
  }

  ExpireOutcome Expire(int64_t now) {
    ExpireOutcome out;
    // 1. Leases past their expiry.
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expiry < now) {
        Pin(it->second, -1);
        expired_leases_++;
        it = leases_.erase(it);
      } else {
        ++it;
      }
    }
    // 2. Puts past their deadline, with what hangs from them.
    std::vector<Hash128> timed_out;
    for (const ModelEntry& e : entries_) {
      if (e.committed || e.deadline >= now) continue;
      out.reclaimed.push_back(e.reservation_id);
      bool under_another = false;
      for (const ModelEntry& p : entries_) {
        if (&p != &e && !p.committed && p.deadline < now && InSubtree(e, p)) under_another = true;
      }
      out.min_expired_puts += under_another ? 0 : 1;
    }
    std::sort(out.reclaimed.begin(), out.reclaimed.end());
    out.max_expired_puts = static_cast<int64_t>(out.reclaimed.size());
    for (uint64_t id : out.reclaimed) Abort(id);
    // 3. Idle entries, LRU-oldest first, stopping at the first one still fresh.
    if (config_.page_ttl.has_value()) {
      for (int i = OldestEvictable(EntryClass::kPage); i >= 0; i = OldestEvictable(EntryClass::kPage)) {
        if (entries_[i].last_use + *config_.page_ttl > now) break;
        Evict(i, /*ttl=*/true);
      }
    }
    if (config_.state_ttl.has_value()) {
      for (int i = OldestEvictable(EntryClass::kState); i >= 0; i = OldestEvictable(EntryClass::kState)) {
        if (entries_[i].last_use + *config_.state_ttl > now) break;
        Evict(i, /*ttl=*/true);
      }
    }
    return out;
  }

 private:
  ModelClassCounters& Counters(EntryClass c) { return counters_[static_cast<int>(c)]; }

  int Find(EntryClass c, int ns, const Tokens& prefix) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      const ModelEntry& e = entries_[i];
      if (e.cls == c && e.ns == ns && e.prefix == prefix) return static_cast<int>(i);
    }
    return -1;
  }

  int FindReservation(uint64_t id) const {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!entries_[i].committed && entries_[i].reservation_id == id) return static_cast<int>(i);
    }
    return -1;
  }

  // What an entry of `ns` is valued by when used now: the namespace's
  // registered cost, or the fallback.
  PrefillCost CostOf(int ns) const {
    return ns_cost_[ns].value_or(
        PrefillCost{config_.utility_cost.flops_per_token, config_.utility_cost.flops_per_token_context});
  }

  // The latest cost a put carries wins; true when it changed the namespace's.
  bool RegisterModelCost(const PutRequest& req) {
    if (!req.model_cost.has_value() || ns_cost_[req.ns] == req.model_cost) return false;
    ns_cost_[req.ns] = req.model_cost;
    return true;
  }

  UtilityCost CostModel(const ModelEntry& e) const {
    return UtilityCost{e.cost.flops_per_token, e.cost.flops_per_token_context, config_.utility_cost.recency_blend};
  }

  void Use(ModelEntry& e, int64_t now) {
    e.use_order = ++use_counter_;
    e.base = clock_[static_cast<int>(e.cls)];
    e.cost = CostOf(e.ns);
    e.last_use = now;
  }

  // Whether `e` is `page` or hangs from it, directly or through other pages.
  static bool InSubtree(const ModelEntry& e, const ModelEntry& page) {
    return page.cls == EntryClass::kPage && e.ns == page.ns && e.prefix.size() >= page.prefix.size() &&
           StartsWith(e.prefix, page.prefix);
  }

  bool IsChild(const ModelEntry& e, const ModelEntry& page) const {
    return e.cls == EntryClass::kPage && InSubtree(e, page) && e.prefix.size() == page.prefix.size() + page.page_size;
  }
  bool IsAttachedState(const ModelEntry& e, const ModelEntry& page) const {
    return e.cls == EntryClass::kState && InSubtree(e, page) && e.NodeDepth() == page.NodeDepth();
  }

  bool Evictable(const ModelEntry& e) const {
    if (!e.committed || e.pins > 0) return false;
    if (e.cls == EntryClass::kState) return true;
    for (const ModelEntry& other : entries_) {
      if (IsChild(other, e)) return false;
      if (IsAttachedState(other, e) && (!other.committed || other.pins > 0)) return false;
    }
    return true;
  }

  int OldestEvictable(EntryClass c) const {
    int best = -1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const ModelEntry& e = entries_[i];
      if (e.cls != c || !Evictable(e)) continue;
      if (best < 0 || e.use_order < entries_[best].use_order) best = static_cast<int>(i);
    }
    return best;
  }

  // Utility: what an evictable entry is worth now (the index keys it
  // eagerly; here it is recomputed from scratch at every choice).
  double Priority(const ModelEntry& e) const {
    const int64_t position = static_cast<int64_t>(e.prefix.size());
    if (e.cls == EntryClass::kState) return e.base + StateUtilityIncrement(CostModel(e), position, e.charge);
    // A page ends at depth * page_size: what a state to come there would save.
    int64_t deepest = static_cast<int64_t>(e.prefix.size());
    for (const ModelEntry& s : entries_) {
      if (IsAttachedState(s, e)) deepest = std::max(deepest, static_cast<int64_t>(s.prefix.size()));
    }
    return e.base + PageUtilityIncrement(CostModel(e), deepest, static_cast<int64_t>(e.NodeDepth()), e.charge);
  }

  // Utility: the evictable entry of lowest (priority, use order).
  int LowestPriority(EntryClass c) const {
    int best = -1;
    double best_priority = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const ModelEntry& e = entries_[i];
      if (e.cls != c || !Evictable(e)) continue;
      const double priority = Priority(e);
      if (best < 0 || priority < best_priority ||
          (priority == best_priority && e.use_order < entries_[best].use_order)) {
        best = static_cast<int>(i);
        best_priority = priority;
      }
    }
    return best;
  }

  bool MakeRoom(EntryClass c, int64_t charge) {
    while (Bytes(c, true) + Bytes(c, false) + Metadata(c) + charge > Budget(c)) {
      const int victim = config_.utility ? LowestPriority(c) : OldestEvictable(c);
      if (victim < 0) return false;
      if (config_.utility) {
        double& clock = clock_[static_cast<int>(c)];
        clock = std::max(clock, Priority(entries_[victim]));
      }
      Evict(victim, /*ttl=*/false);
    }
    return true;
  }

  // LRU or TTL eviction; a page takes the states hanging from it along.
  void Evict(int i, bool ttl) {
    const ModelEntry victim = entries_[i];
    ModelClassCounters& counters = Counters(victim.cls);
    (ttl ? counters.evicted_ttl : counters.evicted_lru)++;
    std::vector<EntryRef> doomed = {{victim.cls, victim.key}};
    if (victim.cls == EntryClass::kPage) {
      for (const ModelEntry& e : entries_) {
        if (!IsAttachedState(e, victim)) continue;
        if (e.committed) Counters(EntryClass::kState).dropped_with_pages++;
        doomed.emplace_back(e.cls, e.key);
      }
    }
    Erase(doomed, /*corrupt=*/false);
  }

  // An aborted (or timed-out) put; a page takes its whole subtree along.
  void AbortEntry(int i) {
    const ModelEntry put = entries_[i];
    std::vector<EntryRef> doomed = {{put.cls, put.key}};
    if (put.cls == EntryClass::kPage) {
      for (const ModelEntry& e : entries_) {
        if (&e == &entries_[i] || !InSubtree(e, put)) continue;
        // Committed states go "with their pages"; pages under an aborted put
        // are counted nowhere (as in the index: they share the abort reason).
        if (e.cls == EntryClass::kState && e.committed) Counters(EntryClass::kState).dropped_with_pages++;
        doomed.emplace_back(e.cls, e.key);
      }
    }
    Erase(doomed, /*corrupt=*/false);
  }

  // Only a corrupt entry may go while leased.
  void Erase(const std::vector<EntryRef>& doomed, bool corrupt) {
    for (const auto& [c, k] : doomed) {
      const int i = FindByKey(c, k);
      if (i < 0) continue;
      if (entries_[i].pins > 0 && !corrupt) {
        error_ = absl::StrCat("removed the leased ", ClassName(c), " ", k.ToHex());
      }
      graveyard_.push_back(entries_[i]);
      if (graveyard_.size() > 64) graveyard_.pop_front();
      entries_.erase(entries_.begin() + i);
    }
  }

  void Pin(const ModelLease& lease, int delta) {
    for (const HeldEntry& h : lease.entries) {
      if (h.cls == EntryClass::kPage && lease.pages_void) continue;
      const int i = FindHeld(h);
      if (i >= 0) entries_[i].pins += delta;  // else removed as corrupt
    }
  }

  const Config config_;
  Hash128 ns_keys_[kNamespaces];
  std::vector<ModelEntry> entries_;
  std::map<uint64_t, ModelLease> leases_;
  std::deque<ModelEntry> graveyard_;  // recently removed entries: probes and re-puts
  uint64_t use_counter_ = 0;
  double clock_[2] = {0, 0};  // utility: per class, the priority of the last victim
  // The latest cost registered per namespace (PutRequest::model_cost); stale
  // once the namespace empties, until the next Reserve forgets it.
  std::optional<PrefillCost> ns_cost_[kNamespaces];
  uint64_t serial_counter_ = 0;
  ModelClassCounters counters_[2];
  int64_t lookups_ = 0;
  int64_t lookup_hits_ = 0;
  int64_t hits_grid_ = 0;
  int64_t hits_exact_ = 0;
  int64_t expired_leases_ = 0;
  int64_t checksum_failures_ = 0;
  std::string error_;  // the model's own consistency checks
};

// ---------------------------------------------------------------------------
// The driver: random operations against both, compared after each.

}  // namespace hybridserve::cachestore::reference

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_REFERENCE_MODEL_H_
