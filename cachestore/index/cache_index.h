#ifndef HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_H_

// The cachestore's core: a radix tree of KV pages per namespace, SSM states
// attached to the page nodes they need, the entry lifecycle (reserve, commit,
// lease), byte budgets, and LRU or utility eviction and TTL expiry
// (docs/ARCHITECTURE.md section 4).
//
// Not thread-safe, does no I/O and reads no clock: every call that depends on
// time takes `now`. CacheStore wraps it with a mutex and a Clock.
//
// One class, its definition in rooms: cache_index.cc (reserve, commit,
// lookup), cache_index_leases.cc, cache_index_retention.cc (session TTL,
// pins, pin quotas), cache_index_eviction.cc (LRU, expiry, removal) and
// cache_index_invariants.cc (CheckInvariants).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/index/blob_pool.h"
#include "cachestore/index/eviction_utility.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

struct CacheIndexOptions {
  int64_t page_budget_bytes = int64_t{1} << 30;
  int64_t state_budget_bytes = int64_t{1} << 30;
  // Idle time (since last use) after which a committed entry expires.
  absl::Duration page_ttl = absl::InfiniteDuration();
  absl::Duration state_ttl = absl::InfiniteDuration();
  // A lease not released within this time (extended by every read) expires.
  absl::Duration lease_ttl = absl::Seconds(30);
  // A put with no progress for this long is reclaimed.
  absl::Duration put_timeout = absl::Seconds(30);
  // Longest token list a lookup accepts, and deepest position a put may name.
  int64_t max_tokens = int64_t{1} << 20;
  // Freed entry buffers kept for reuse by puts of the same size (outside the
  // budgets, and never more than an eighth of them); 0 disables recycling.
  // See BlobPool.
  int64_t blob_pool_bytes = int64_t{256} << 20;
  // Where entry bytes live (BlobPool): kSharedMemory makes every entry a slot
  // of a memfd slab that the shared-memory read path sends without a copy
  // (CacheStoreServer sets it when ServerOptions::shm has a socket);
  // CacheStore::Create refuses it where memfds cannot be made or reopened.
  BlobStorage blob_storage = BlobStorage::kHeap;
  // Session retention (PutSpec::ttl, PutSpec::pin): the longest TTL an entry
  // may ask for, the bytes of pinned states one tenant may hold (PutSpec::tenant:
  // all its namespaces together, whatever their salts), and all tenants
  // together (-1: half the state budget).
  absl::Duration max_session_ttl = absl::Hours(24);
  int64_t pin_quota_bytes = int64_t{64} << 20;
  int64_t pin_budget_bytes = -1;
  // Index memory each entry costs beside its bytes (its node or state record,
  // its hash-map slot and LRU position), counted against its class's budget
  // with the entry; a state's tail tokens count too (4 bytes each). So every
  // byte a client can make the index hold is within the budgets.
  int64_t entry_overhead_bytes = kDefaultEntryOverheadBytes;
  // Namespaces (model, adapter, cache salt, page size) held at once, and
  // leases open at once: beyond them a put into a new namespace or a leasing
  // lookup is RESOURCE_EXHAUSTED. A lease costs the same whatever its length.
  int64_t max_namespaces = int64_t{1} << 16;
  int64_t max_leases = int64_t{1} << 16;
  // Which evictable entry of a class makes room for a put: the least recently
  // used, or the lowest GreedyDual-Size priority by FLOPs saved per byte
  // (eviction_utility.h). An entry is valued by its namespace's model cost
  // (PutSpec::model_cost) as it stood at the entry's last use, as its base
  // is the clock at its last use; `utility` holds the cost of namespaces that
  // registered none (the fallback) and the cache-wide recency blend.
  // Either way only evictable entries go (never leased, pinned, reserved or
  // interior pages), each choice in O(log n), and TTL expiry stays by idle time.
  EvictionPolicy eviction = EvictionPolicy::kLru;
  UtilityCost utility;
  // Called inside the call that evicts, once for each committed entry removed
  // to make room (either policy) and each committed state dropped with such a
  // page (before its page), never for TTL expiry, aborts or corrupt removals.
  // It must not call the index. Empty: not called. bench/cachestore's
  // simulated disk tier (cache_sim.h) spills through it.
  std::function<void(const EntryInfo&)> on_evict;

  // What the index allocates per entry on x86-64 with glibc, measured by
  // //cachestore/index:cache_index_memory_test through malloc's own count (the
  // record, map slots, the LRU and utility set nodes, a state's tail vector,
  // the blob's header): 560 bytes a page and 608 a state under LRU, 601 and
  // 713 under utility. Was 512, below all four; that test fails when the
  // charge falls below what is allocated.
  static constexpr int64_t kDefaultEntryOverheadBytes = 768;
};

class CacheIndex {
 public:
  explicit CacheIndex(const CacheIndexOptions& options);
  ~CacheIndex();
  CacheIndex(const CacheIndex&) = delete;
  CacheIndex& operator=(const CacheIndex&) = delete;

  const CacheIndexOptions& options() const { return options_; }

  // Reserves room for an entry: validates the spec, evicts entries of its
  // class (options().eviction) until it fits, and creates the entry invisible to lookups.
  // INVALID_ARGUMENT: malformed spec. FAILED_PRECONDITION: the parent page is
  // not in the cache. ABORTED: a put of the same entry is in flight.
  // RESOURCE_EXHAUSTED: larger than the budget, or the budget is held by
  // pinned and in-flight entries.
  absl::StatusOr<Reservation> Reserve(const PutSpec& spec, absl::Time now);

  // Records progress of a put, extending its deadline. ABORTED if the put was
  // reclaimed (timed out, or its parent page was removed).
  absl::Status Touch(uint64_t reservation_id, absl::Time now);

  // Makes a reserved entry visible. The caller has verified that the bytes
  // match `checksum`. ABORTED if the put was reclaimed.
  absl::Status Commit(uint64_t reservation_id, uint64_t checksum, absl::Time now);

  // Drops a reservation (and, for a page, every entry that hangs from it).
  // Unknown ids are ignored: the put may have been reclaimed already.
  void Abort(uint64_t reservation_id);

  // The resume point of a prompt. `page_keys` are PageKeys(ns, tokens,
  // page_size), computed by the caller outside any lock. With `lease`, the
  // returned pages and state are pinned until Release or expiry.
  absl::StatusOr<LookupResult> Lookup(const Hash128& ns, int32_t page_size, absl::Span<const Hash128> page_keys,
                                      absl::Span<const TokenId> tokens, bool lease, absl::Time now);

  // The bytes of a leased entry; extends the lease. NOT_FOUND for an unknown
  // or expired lease or a key the lease does not hold.
  absl::StatusOr<ReadHandle> Open(uint64_t lease_id, const Hash128& key, absl::Time now);

  // Ends a lease. NOT_FOUND if unknown or expired.
  absl::Status Release(uint64_t lease_id);

  // Removes an entry whose bytes failed verification (with every entry that
  // depends on it). Unknown keys are ignored.
  void RemoveCorrupt(EntryClass entry_class, const Hash128& key);

  // Expires leases and puts past their deadlines and entries idle past their
  // TTL. Returns the ids of the reclaimed puts.
  std::vector<uint64_t> Expire(absl::Time now);

  IndexStats Stats() const;

  // Whether an entry (committed or reserved) is in the index.
  bool Contains(EntryClass entry_class, const Hash128& key) const;

  // The model cost namespace `ns` registered; nullopt when it registered none
  // (it uses options().utility's) or holds no entries.
  std::optional<PrefillCost> ModelCostOf(const Hash128& ns) const;

  // Recomputes every counter and structural invariant from scratch (budget,
  // accounting, tree links, pin counts, LRU membership). For tests.
  absl::Status CheckInvariants() const;

 private:
  struct State;
  struct Entry {
    bool committed = false;
    int64_t size = 0;    // the entry's bytes
    int64_t charge = 0;  // against the budget: size + index memory (options_.entry_overhead_bytes, tail)
    uint64_t checksum = 0;
    std::shared_ptr<Blob> blob;
    int pins = 0;
    uint64_t reservation_id = 0;  // while reserved
    uint64_t serial = 0;          // unique per stored entry: a re-put key is a new entry
    absl::Time last_use;          // committed: LRU/TTL clock
    uint64_t tick = 0;            // LRU order key while in the evictable set
    // Utility policy: the class clock at the last use, and the order key in
    // the class's utility set (base + the increment it has now).
    double base = 0;
    double priority = 0;
    PrefillCost cost;        // its namespace's cost at the last use (CostOf)
    bool evictable = false;  // member of its class's evictable set
  };
  // A page of a namespace's radix tree; depth 0 is the namespace root, which
  // holds no bytes and is never evicted.
  struct Node {
    Hash128 key;
    Node* parent = nullptr;  // null for a root
    Node* root = nullptr;    // self for a root
    // An ancestor (self for a root) chosen so that LevelAncestor takes
    // O(log depth) steps (skew-binary jump pointers): a lease names only its
    // deepest page and still answers "is this page mine" without a list.
    Node* jump = nullptr;
    int64_t depth = 0;      // pages from the root through this one
    int32_t page_size = 0;  // roots only
    Entry entry;
    std::vector<Node*> children;
    std::vector<State*> states;  // State::slot is the position here
    // Tail lengths of the states here, with their counts: a lookup hashes the
    // prompt once per length present, never per state.
    std::map<int64_t, int> tail_lengths;
    int busy_states = 0;  // attached states reserved or pinned
    std::string tenant;   // roots: the namespace's tenant (PutSpec::tenant)
    // Roots: the latest model cost a put registered (PutSpec::model_cost).
    // Bounded with the roots by max_namespaces; outside the budgets, like
    // the root itself.
    std::optional<PrefillCost> model_cost;
  };
  struct State {
    Hash128 key;
    Node* node = nullptr;
    size_t slot = 0;  // in node->states
    std::vector<TokenId> tail;
    int64_t position = 0;
    StateKind kind = StateKind::kExactPrefix;
    Entry entry;
    // Session retention: its own TTL (zero: the class's) and pin. A state
    // with a TTL is in session_expiry_ once committed, keyed by `expiry`.
    absl::Duration ttl = absl::ZeroDuration();
    bool session_pin = false;
    absl::Time expiry = absl::InfiniteFuture();
  };
  struct PendingPut {
    EntryClass entry_class;
    Hash128 key;
    absl::Time deadline;  // its position in put_deadlines_
  };
  struct Held {
    EntryClass entry_class;
    Hash128 key;
    uint64_t serial;  // the entry's identity: a re-put key is a new entry
  };
  // A lease pins only the deepest page and the state: every shallower page
  // is an interior node (never evictable) while the deepest exists, and a
  // removal that takes one of them (a failed checksum) takes the deepest too.
  // Its size does not depend on the number of pages.
  struct Lease {
    absl::Time expiry;            // its position in lease_expiry_
    std::optional<Held> deepest;  // page n - 1, when n > 0
    Held state;
  };
  enum class RemoveReason { kLru, kTtl, kAborted, kCorrupt, kWithPages };

  // Reserve, commit and lookup (cache_index.cc).
  int64_t Budget(EntryClass c) const;
  ClassStats& Counters(EntryClass c);
  absl::Status ValidateSpec(const PutSpec& spec) const;
  // What an entry of `spec` counts against its budget: its bytes and its
  // index memory.
  int64_t Charge(const PutSpec& spec) const;
  // A busy state is not evictable and keeps its page from eviction (and so
  // every page above it): reserved, leased, or session-pinned.
  bool IsBusy(const State& s) const { return !s.entry.committed || s.entry.pins > 0 || s.session_pin; }
  // The deepest committed state at `node` whose tail is a prefix of `rest`
  // (the prompt after the node's pages); null when none.
  State* MatchState(const Node& node, absl::Span<const TokenId> rest) const;
  void SetPutDeadline(uint64_t reservation_id, PendingPut& put, absl::Time deadline);
  static EntryInfo PageInfo(const Node& n, int32_t page_size);
  static EntryInfo StateInfo(const State& s);

  // Leases (cache_index_leases.cc).
  // Finds the entry a lease holds; null when it is gone (or was replaced).
  Entry* HeldEntry(EntryClass c, const Hash128& key, uint64_t serial);
  void Pin(EntryClass c, const Hash128& key, uint64_t serial, int delta);
  void PinLease(const Lease& lease, int delta);
  void ReleaseLeaseEntries(const Lease& lease);
  void SetLeaseExpiry(uint64_t lease_id, Lease& lease, absl::Time expiry);
  // The ancestor of `node` at `depth` (<= node->depth).
  static const Node* LevelAncestor(const Node* node, int64_t depth);

  // Session retention (cache_index_retention.cc).
  int64_t PinBudget() const;
  // Grants what `spec` asks (TTL, pin) to `state`, committed or not, and
  // reports it in `r`. Never takes a pin or a TTL away.
  void ApplyRetention(State* state, const PutSpec& spec, Reservation* r);
  // Re-files a committed state with a TTL in session_expiry_ after a use.
  void RefreshExpiry(State* state);

  // Eviction, LRU order and removal (cache_index_eviction.cc).
  // Evicts entries of class `c` (LRU or lowest utility priority) until
  // `charge` more bytes fit.
  absl::Status MakeRoom(EntryClass c, int64_t charge);
  void UseNode(Node* node, absl::Time now);
  void UseState(State* state, absl::Time now);
  void RefreshNode(Node* node);
  void RefreshState(State* state);
  // Utility policy: what a page or state would be keyed by now, and
  // re-filing an evictable page whose key changed because its states did (a
  // state's key changes only when it is used). RekeyNode is a no-op under LRU.
  bool UtilityPolicy() const { return options_.eviction == EvictionPolicy::kUtility; }
  // The cost an entry of `root`'s namespace is valued by when used now: the
  // namespace's registered cost, or the fallback. An entry keeps it in
  // Entry::cost until its next use.
  PrefillCost CostOf(const Node& root) const;
  // Sets `root`'s cost to what `spec` carries, if anything; true when that
  // registered a new cost.
  bool RegisterModelCost(Node* root, const PutSpec& spec);
  // The arithmetic's cost model for an entry: its cost and the blend.
  UtilityCost EntryUtilityCost(const Entry& e) const {
    return UtilityCost{e.cost.flops_per_token, e.cost.flops_per_token_context, options_.utility.recency_blend};
  }
  double NodePriority(const Node& node) const;
  double StatePriority(const State& state) const;
  void RekeyNode(Node* node);
  // The evictable set a state belongs in: states with their own TTL expire by
  // session_expiry_, the others by the class TTL in LRU order.
  std::set<std::pair<uint64_t, State*>>& StateLru(const State& s) {
    return s.ttl > absl::ZeroDuration() ? session_lru_ : state_lru_;
  }
  const std::set<std::pair<uint64_t, State*>>& StateLru(const State& s) const {
    return s.ttl > absl::ZeroDuration() ? session_lru_ : state_lru_;
  }
  void RemoveSubtree(Node* node, RemoveReason reason);
  void RemoveNodeOnly(Node* node, RemoveReason reason);
  void RemoveState(State* state, RemoveReason reason);
  void ForgetEntryBytes(EntryClass c, Entry* e);
  void MaybeRemoveRoot(Node* root);
  // After `node` lost a child page or a state: an empty root goes, a page may
  // become evictable.
  void RefreshAfterRemoval(Node* node);
  // Counts a removal of `e` for `reason` (evicted, expired, dropped with its
  // pages) in its class's `counters`.
  static void CountRemoval(RemoveReason reason, const Entry& e, ClassStats& counters);

  // CheckInvariants (cache_index_invariants.cc).
  absl::Status CheckStateSlots(const Node& node) const;

  const CacheIndexOptions options_;
  const std::shared_ptr<BlobPool> blob_pool_;
  absl::flat_hash_map<Hash128, std::unique_ptr<Node>> roots_;
  absl::flat_hash_map<Hash128, std::unique_ptr<Node>> pages_;
  absl::flat_hash_map<Hash128, std::unique_ptr<State>> states_;
  absl::flat_hash_map<uint64_t, PendingPut> puts_;
  absl::flat_hash_map<uint64_t, Lease> leases_;
  // Evictable entries by LRU tick, oldest first: committed, unpinned pages
  // with no children and no busy states; committed, unpinned states, those
  // with the class TTL in state_lru_ and those with their own in session_lru_
  // (so the class-TTL scan never walks past session states).
  std::set<std::pair<uint64_t, Node*>> page_lru_;
  std::set<std::pair<uint64_t, State*>> state_lru_;
  std::set<std::pair<uint64_t, State*>> session_lru_;
  // Utility policy: the same evictable entries (all states in one set) by
  // (priority, tick), lowest first, and each class's clock. Empty under LRU.
  std::set<std::tuple<double, uint64_t, Node*>> page_utility_;
  std::set<std::tuple<double, uint64_t, State*>> state_utility_;
  double page_clock_ = 0;
  double state_clock_ = 0;
  // Deadlines, soonest first: the reaper's work is what expires, not what is open.
  std::set<std::pair<absl::Time, uint64_t>> lease_expiry_;
  std::set<std::pair<absl::Time, uint64_t>> put_deadlines_;
  // Committed states with their own TTL, by expiry.
  std::set<std::pair<absl::Time, State*>> session_expiry_;
  int64_t pinned_bytes_ = 0;
  int64_t pinned_states_ = 0;
  int64_t roots_with_model_cost_ = 0;
  // Session-pinned state bytes by tenant (present while > 0).
  absl::flat_hash_map<std::string, int64_t> tenant_pinned_bytes_;
  uint64_t next_tick_ = 1;
  uint64_t next_id_ = 1;
  ClassStats page_stats_;
  ClassStats state_stats_;
  IndexStats totals_;  // the non-class counters
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_CACHE_INDEX_H_
