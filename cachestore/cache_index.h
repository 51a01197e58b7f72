#ifndef HYBRIDSERVE_CACHESTORE_CACHE_INDEX_H_
#define HYBRIDSERVE_CACHESTORE_CACHE_INDEX_H_

// The cachestore's core: a radix tree of KV pages per namespace, SSM states
// attached to the page nodes they need, the entry lifecycle (reserve, commit,
// lease), byte budgets, and LRU/TTL eviction (DESIGN.md section 3).
//
// Not thread-safe, does no I/O and reads no clock: every call that depends on
// time takes `now`. CacheStore wraps it with a mutex and a Clock.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"

namespace hybridserve::cachestore {

enum class EntryClass { kPage = 0, kState = 1 };
enum class StateKind { kGridCheckpoint = 0, kExactPrefix = 1 };

// Where an entry's bytes live (DESIGN.md section 1: a field, not an assumption).
enum class EntryLocation { kCacheStoreHost = 0 };

// The bytes of one entry: written once by its put, immutable after commit.
// Shared so that a reader holding it is never left with freed memory.
struct Blob {
  explicit Blob(size_t n) : data(new uint8_t[n]), size(n) {}
  std::unique_ptr<uint8_t[]> data;
  size_t size;
};

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
};

// What to store. The index derives the key from `parent` and `tokens`.
struct PutSpec {
  Hash128 ns;
  int32_t page_size = 0;
  EntryClass entry_class = EntryClass::kPage;
  // K_{n-1} the entry hangs from; nullopt for the namespace root.
  std::optional<Hash128> parent;
  // A page: exactly page_size tokens. A state: the tail tokens[n*page_size, p).
  std::vector<TokenId> tokens;
  // States only.
  StateKind state_kind = StateKind::kExactPrefix;
  int64_t position = 0;
  int64_t size_bytes = 0;
};

struct Reservation {
  uint64_t id = 0;  // 0 when already_present
  Hash128 key;
  // The entry was already committed; nothing was reserved.
  bool already_present = false;
  // Where the writer puts the bytes (null when already_present).
  std::shared_ptr<Blob> blob;
};

struct EntryInfo {
  Hash128 key;
  EntryClass entry_class = EntryClass::kPage;
  int64_t size_bytes = 0;
  uint64_t checksum = 0;
  EntryLocation location = EntryLocation::kCacheStoreHost;
  StateKind state_kind = StateKind::kExactPrefix;
  int64_t position = 0;  // states: p; pages: tokens covered through this page
};

struct LookupResult {
  // Deepest p with a state at p and pages covering [0, floor(p/page_size)).
  int64_t resume_position = 0;
  // Tokens covered by the longest chain of committed pages.
  int64_t kv_match_tokens = 0;
  std::vector<EntryInfo> pages;     // pages [0, floor(p/page_size)), in order
  std::optional<EntryInfo> state;   // the state at p
  uint64_t lease_id = 0;            // 0: nothing leased
  absl::Time lease_expiry = absl::InfinitePast();
};

struct ReadHandle {
  EntryInfo info;
  std::shared_ptr<const Blob> blob;
};

struct ClassStats {
  int64_t entries = 0;  // committed
  int64_t resident_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t budget_bytes = 0;
  int64_t evicted_lru = 0;
  int64_t evicted_ttl = 0;
  int64_t dropped_with_pages = 0;
};

struct IndexStats {
  ClassStats pages;
  ClassStats states;
  int64_t namespaces = 0;
  int64_t active_leases = 0;
  int64_t active_puts = 0;
  int64_t lookups = 0;
  int64_t lookup_hits = 0;
  int64_t hits_grid_checkpoint = 0;
  int64_t hits_exact_prefix = 0;
  int64_t checksum_failures = 0;
  int64_t expired_leases = 0;
  int64_t expired_puts = 0;
};

class CacheIndex {
 public:
  explicit CacheIndex(const CacheIndexOptions& options);
  ~CacheIndex();
  CacheIndex(const CacheIndex&) = delete;
  CacheIndex& operator=(const CacheIndex&) = delete;

  const CacheIndexOptions& options() const { return options_; }

  // Reserves room for an entry: validates the spec, evicts LRU entries of its
  // class until it fits, and creates the entry invisible to lookups.
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
  absl::StatusOr<LookupResult> Lookup(const Hash128& ns, int32_t page_size,
                                      absl::Span<const Hash128> page_keys,
                                      absl::Span<const TokenId> tokens, bool lease,
                                      absl::Time now);

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

  // Recomputes every counter and structural invariant from scratch (budget,
  // accounting, tree links, pin counts, LRU membership). For tests.
  absl::Status CheckInvariants() const;

 private:
  struct State;
  struct Entry {
    bool committed = false;
    int64_t size = 0;
    uint64_t checksum = 0;
    std::shared_ptr<Blob> blob;
    int pins = 0;
    uint64_t reservation_id = 0;  // while reserved
    absl::Time last_use;          // committed: LRU/TTL clock
    uint64_t tick = 0;            // LRU order key while in the evictable set
    bool evictable = false;       // member of its class's evictable set
  };
  // A page of a namespace's radix tree; depth 0 is the namespace root, which
  // holds no bytes and is never evicted.
  struct Node {
    Hash128 key;
    Node* parent = nullptr;  // null for a root
    Node* root = nullptr;    // self for a root
    int64_t depth = 0;       // pages from the root through this one
    int32_t page_size = 0;   // roots only
    Entry entry;
    std::vector<Node*> children;
    std::vector<State*> states;
    int busy_states = 0;  // attached states reserved or pinned
  };
  struct State {
    Hash128 key;
    Node* node = nullptr;
    std::vector<TokenId> tail;
    int64_t position = 0;
    StateKind kind = StateKind::kExactPrefix;
    Entry entry;
  };
  struct PendingPut {
    EntryClass entry_class;
    Hash128 key;
    absl::Time deadline;
  };
  struct Lease {
    absl::Time expiry;
    std::vector<std::pair<EntryClass, Hash128>> entries;
  };
  enum class RemoveReason { kLru, kTtl, kAborted, kCorrupt, kWithPages };

  int64_t Budget(EntryClass c) const;
  ClassStats& Counters(EntryClass c);
  absl::Status ValidateSpec(const PutSpec& spec) const;
  absl::Status MakeRoom(EntryClass c, int64_t bytes);
  bool IsBusy(const State& s) const { return !s.entry.committed || s.entry.pins > 0; }

  void UseNode(Node* node, absl::Time now);
  void UseState(State* state, absl::Time now);
  void RefreshNode(Node* node);
  void RefreshState(State* state);
  void Pin(EntryClass c, const Hash128& key, int delta);

  void RemoveSubtree(Node* node, RemoveReason reason);
  void RemoveNodeOnly(Node* node, RemoveReason reason);
  void RemoveState(State* state, RemoveReason reason);
  void ForgetEntryBytes(EntryClass c, Entry* e);
  void MaybeRemoveRoot(Node* root);
  void ReleaseLeaseEntries(const Lease& lease);
  static EntryInfo PageInfo(const Node& n, int32_t page_size);
  static EntryInfo StateInfo(const State& s);

  const CacheIndexOptions options_;
  absl::flat_hash_map<Hash128, std::unique_ptr<Node>> roots_;
  absl::flat_hash_map<Hash128, std::unique_ptr<Node>> pages_;
  absl::flat_hash_map<Hash128, std::unique_ptr<State>> states_;
  absl::flat_hash_map<uint64_t, PendingPut> puts_;
  absl::flat_hash_map<uint64_t, Lease> leases_;
  // Evictable entries by LRU tick, oldest first: committed, unpinned pages
  // with no children and no busy states; committed, unpinned states.
  std::set<std::pair<uint64_t, Node*>> page_lru_;
  std::set<std::pair<uint64_t, State*>> state_lru_;
  uint64_t next_tick_ = 1;
  uint64_t next_id_ = 1;
  ClassStats page_stats_;
  ClassStats state_stats_;
  IndexStats totals_;  // the non-class counters
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CACHE_INDEX_H_
