#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_SHARDED_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_SHARDED_CACHE_CLIENT_H_

// A CacheClient over several cachestore shards (issue 49, "Shards"), each
// reached by a CacheClient of its own (in a worker: that shard's gRPC,
// direct-read and direct-put stack, worker/cache_stack.h). Where a call goes:
//
//   Lookup        the owner of (N, K_0 of the tokens) (shard_placement.h):
//                 one call to one shard.
//   Put, PutMany  the owner of (N, ns.placement). Without a placement, an
//                 entry with no parent is placed by its own chain (a page by
//                 its tokens' K_0, a state by N); an entry with a parent
//                 cannot be (INVALID_ARGUMENT naming `placement`). PutMany's
//                 entries all go to one shard (its unplaced entries with no
//                 parent must agree on it).
//   GetInto, GetManyInto, GetManyScattered, Release
//                 the shard whose slot the lease id carries: Lookup returns
//                 the shard's lease id with this client's slot of the shard
//                 in its top 16 bits (a shard's id of more than 48 bits is
//                 INTERNAL, and that lease is released); an id whose slot
//                 names no shard of the set is NOT_FOUND.
//   Stats         every shard's, summed; UNAVAILABLE naming the first shard
//                 that is down or fails (a partial sum would pass for the
//                 cache's).
//
// A lost shard costs misses only. A call that ends UNAVAILABLE or
// DEADLINE_EXCEEDED marks its shard down (and a timeout answers UNAVAILABLE:
// one hung shard must not start the worker's cache-wide skip, cache_backoff.h). A down shard gets no call at all:
// placement skips it (the next shard of ShardPlacement::Ranked owns its
// chains, so their next lookup misses there once and the caller's
// publication re-publishes them there), and a call holding one of its leases
// answers UNAVAILABLE at once. One background thread probes each down shard
// (its probe client's Stats) every probe_interval and marks it up when it
// answers; its chains then return to it (misses there once: a restarted
// shard is empty unless its disk tier kept them). When every shard is down,
// every call answers UNAVAILABLE at once (a miss).
//
// Membership: the shards given to Create, then to each SetShards (a
// re-resolved headless Service). Shards are placed by name, never by
// address: a shard whose name stays keeps its slot and counters when its
// target or client changes (a restarted pod with a new IP). The set may be
// empty (a headless Service with no shard resolved yet): every call is then
// UNAVAILABLE at once.
//
// Thread-safe. Calls in flight keep the shard clients they use alive
// (shared_ptr) across a SetShards that drops them.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/shard_placement.h"

namespace hybridserve::cachestore {

// One shard as the membership gives it.
struct CacheShard {
  // What placement hashes: the name the shard reports (its --shard_name),
  // or the target itself for a static list. Not empty; unique in a set.
  std::string name;
  // How it is reached (host:port), for logs and metrics.
  std::string target;
  // The shard's client; required.
  std::shared_ptr<CacheClient> client;
  // What the prober calls Stats on (a client with a short deadline); null:
  // `client`.
  std::shared_ptr<CacheClient> probe;
};

struct ShardedCacheClientOptions {
  // How often each down shard is probed.
  absl::Duration probe_interval = absl::Milliseconds(500);
};

// One shard's record (cumulative since it joined the set under its name).
struct ShardCounts {
  std::string name;
  std::string target;
  bool up = true;
  int64_t calls = 0;     // calls sent to the shard (probes not counted)
  int64_t failures = 0;  // of them, those that ended UNAVAILABLE or DEADLINE_EXCEEDED
  int64_t refused = 0;   // calls answered UNAVAILABLE at once because the shard was down
};

class ShardedCacheClient final : public CacheClient {
 public:
  // INVALID_ARGUMENT: a shard without a name or client (naming its index),
  // a name given twice (naming it), a probe_interval not positive. Starts
  // the prober.
  static absl::StatusOr<std::unique_ptr<ShardedCacheClient>> Create(std::vector<CacheShard> shards,
                                                                    const ShardedCacheClientOptions& options = {});
  ~ShardedCacheClient() override;

  // Replaces the set (same checks as Create; on error the set is kept). A
  // shard whose name was in the set keeps its slot, counters and, when its
  // target is the same, its state (up or down); a new target starts up.
  // RESOURCE_EXHAUSTED once 65535 distinct names have had a slot.
  absl::Status SetShards(std::vector<CacheShard> shards) ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override;
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override;
  std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                 absl::Span<const PutManyEntry> entries) override;
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override;
  absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) override;
  absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                absl::Span<const EntrySegments> out) override;
  absl::Status Release(uint64_t lease_id) override;
  absl::StatusOr<IndexStats> Stats() override;

  // The shard that owns (N, chain) now: the first shard of
  // ShardPlacement::Ranked that is up; UNAVAILABLE when none is.
  absl::StatusOr<std::string> OwnerOf(const Hash128& ns_key, const Hash128& chain) const ABSL_LOCKS_EXCLUDED(mu_);

  // Each shard of the set, by name.
  std::vector<ShardCounts> counts() const ABSL_LOCKS_EXCLUDED(mu_);

  // The bits of a lease id that carry the shard's slot, and those left for
  // the shard's own id.
  static constexpr int kSlotShift = 48;
  static constexpr uint64_t kShardLeaseMask = (uint64_t{1} << kSlotShift) - 1;

 private:
  struct Shard;
  struct Members;

  explicit ShardedCacheClient(const ShardedCacheClientOptions& options) : options_(options) {}

  std::shared_ptr<const Members> members() const ABSL_LOCKS_EXCLUDED(mu_);
  // The owner of (ns_key, chain) among the shards up; UNAVAILABLE if none.
  absl::StatusOr<std::shared_ptr<Shard>> Owner(const Hash128& ns_key, const Hash128& chain) const;
  // The shard of a lease id and the shard's own id; NOT_FOUND for a slot of
  // no shard, UNAVAILABLE (counted as refused) for a down shard.
  absl::StatusOr<std::shared_ptr<Shard>> ShardOfLease(uint64_t lease_id) const;
  // Counts a call to `shard` that ended in `status`; a transport failure
  // marks the shard down. Returns what the call answers: `status`, but a
  // timeout as UNAVAILABLE: the shard is down now, so no later call waits for
  // it, and a worker's CacheBackoff, which a DEADLINE_EXCEEDED starts and
  // which skips the whole cache, must not skip the shards that answer.
  absl::Status Note(Shard& shard, const absl::Status& status);
  void ProbeLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const ShardedCacheClientOptions options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Members> members_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint16_t> slot_of_name_ ABSL_GUARDED_BY(mu_);
  uint32_t next_slot_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_SHARDED_CACHE_CLIENT_H_
