#ifndef HYBRIDSERVE_CACHESTORE_TYPES_H_
#define HYBRIDSERVE_CACHESTORE_TYPES_H_

// Plain domain types of the cachestore, shared by the core, the service edge
// and the client. Value types; no behaviour.

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "common/prefill_cost.h"

namespace hybridserve::cachestore {

enum class EntryClass { kPage = 0, kState = 1 };

// Where one entry's bytes go when a reader places them itself
// (CacheClient::GetManyScattered): the segments, filled in order, are
// together exactly the entry's size. Borrowed memory, the caller's.
struct EntrySegments {
  std::vector<absl::Span<char>> segments;

  size_t bytes() const {
    size_t total = 0;
    for (const absl::Span<char>& s : segments) total += s.size();
    return total;
  }
};
enum class StateKind { kGridCheckpoint = 0, kExactPrefix = 1 };

// Where an entry's bytes live (docs/ARCHITECTURE.md section 3: a field, not an assumption).
enum class EntryLocation { kCacheStoreHost = 0 };

// Entry buffers of this size or more are anonymous mappings of their own, the
// smaller ones come from malloc (BlobPool allocates both).
inline constexpr size_t kBlobMapThresholdBytes = size_t{128} << 10;

// Frees a blob's bytes the way BlobPool allocated them.
struct BlobBytesDeleter {
  size_t size = 0;
  // The bytes are a slot of a shared-memory slab: the blob's shm_slot frees them.
  bool in_slab = false;
  void operator()(uint8_t* p) const {
    if (p == nullptr || in_slab) return;
    if (size >= kBlobMapThresholdBytes) {
      munmap(p, size);
    } else {
      std::free(p);
    }
  }
};

// Where BlobPool keeps entry bytes: the process's heap and private mappings,
// or slots of memfd-backed slabs that the shared-memory read path sends to
// readers without a copy (shm_slab_allocator.h; the cachestore with
// --shm_socket).
enum class BlobStorage { kHeap = 0, kSharedMemory = 1 };

// The bytes of one entry: written once by its put, immutable after commit.
// Shared so that a reader holding it is never left with freed memory.
// Allocated by BlobPool only.
struct Blob {
  std::unique_ptr<uint8_t[], BlobBytesDeleter> data;
  size_t size = 0;
  // BlobStorage::kSharedMemory only (else -1 and 0): a read-only descriptor
  // of the slab holding the bytes, owned by the slab and open while this blob
  // lives, and the bytes' offset in it.
  int shm_fd = -1;
  uint64_t shm_offset = 0;
  // The slab's read-write descriptor, for the put that fills the bytes
  // (PutSession::WriteFromFile); never sent to anyone.
  int shm_write_fd = -1;
  // Never written since its memory was allocated (BlobPool::Acquire): a put
  // into a fresh slab slot fills it best through shm_write_fd, which faults
  // no page in through the mapping; a recycled buffer's pages are resident,
  // and a copy through the mapping is the faster.
  bool fresh = false;
  // Owns the slot (frees it when the blob goes); null for heap blobs.
  std::shared_ptr<const void> shm_slot;
};

// What to store. The index derives the key from `parent` and `tokens`.
struct PutSpec {
  Hash128 ns;
  // The namespace's tenant (keys.h): whose pin quota a pin counts against.
  // Must be the one ns was derived with.
  std::string tenant;
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
  // Session retention, states only (a session breakpoint). `ttl` > 0: the
  // entry's own idle TTL instead of the class's, capped by the index's
  // max_session_ttl. `pin`: never evicted to make room, only by its TTL
  // (max_session_ttl when `ttl` is 0), within the tenant's pin quota and
  // the index's pin budget; beyond them the entry is stored unpinned and the
  // reservation says why.
  absl::Duration ttl = absl::ZeroDuration();
  bool pin = false;
  // The namespace's model's prefill cost (proto CacheNamespace.model_cost),
  // which the utility eviction values the namespace's entries by. Each put
  // that carries one and is accepted (reserved or already present) sets it:
  // the latest wins. nullopt: the namespace keeps what it has, or the index's
  // fallback (CacheIndexOptions::utility). Not part of the namespace key.
  std::optional<PrefillCost> model_cost;
};

struct Reservation {
  uint64_t id = 0;  // 0 when already_present
  Hash128 key;
  // The entry was already committed; nothing was reserved.
  bool already_present = false;
  // Where the writer puts the bytes (null when already_present).
  std::shared_ptr<Blob> blob;
  // Retention granted (states; also applied to an already present state):
  // the entry's TTL (zero: the class's), whether it is pinned, and why a
  // requested pin was refused (empty when granted or not asked).
  absl::Duration ttl = absl::ZeroDuration();
  bool pinned = false;
  std::string pin_refused;
  // This put registered its namespace's model cost: the namespace had none
  // (or was new), or had another.
  bool model_cost_registered = false;
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
  std::vector<EntryInfo> pages;    // pages [0, floor(p/page_size)), in order
  std::optional<EntryInfo> state;  // the state at p
  uint64_t lease_id = 0;           // 0: nothing leased
  absl::Time lease_expiry = absl::InfinitePast();
  // Which tier served (a store with a disk tier): how many of `pages`, and
  // whether `state`, this lookup read back from disk into memory.
  int64_t pages_from_disk = 0;
  bool state_from_disk = false;
};

struct ReadHandle {
  EntryInfo info;
  std::shared_ptr<const Blob> blob;
};

struct ClassStats {
  int64_t entries = 0;  // committed
  int64_t resident_bytes = 0;
  int64_t reserved_bytes = 0;
  // Index memory of the committed and reserved entries (records, tails),
  // counted against the budget beside their bytes:
  // resident_bytes + reserved_bytes + metadata_bytes <= budget_bytes.
  int64_t metadata_bytes = 0;
  int64_t budget_bytes = 0;
  int64_t evicted_lru = 0;
  int64_t evicted_ttl = 0;
  int64_t dropped_with_pages = 0;
};

// A CacheStore's disk tier (DiskTierCache), all zero without one. Counters
// since the store opened it; `entries` and `bytes` are what is on disk now
// (whole files, the budget's unit).
struct DiskTierUsage {
  bool enabled = false;
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t budget_bytes = 0;
  int64_t queued_bytes = 0;  // evicted entries waiting for the writer
  int64_t writes = 0;        // entries written: evicted ones and at shutdown
  // Entries not written: the queue full, the writer stopped, or an entry
  // larger than the whole disk budget.
  int64_t write_drops = 0;
  int64_t write_failures = 0;  // I/O errors
  int64_t reads = 0;           // entries a lookup read to promote
  int64_t read_hits = 0;       // of them, verified and decoded
  // Reads of an entry the disk held that failed verification or decoding
  // (the entry is removed; the lookup is a miss there).
  int64_t read_failures = 0;
  int64_t promoted_entries = 0;  // put back into memory by lookups
  int64_t promoted_bytes = 0;
  int64_t shutdown_spilled = 0;  // entries written by SpillToDisk
  int64_t evictions = 0;         // by the disk budget
};

struct IndexStats {
  ClassStats pages;
  ClassStats states;
  int64_t namespaces = 0;
  int64_t namespaces_with_model_cost = 0;  // the others use the fallback cost
  int64_t active_leases = 0;
  int64_t active_puts = 0;
  int64_t lookups = 0;
  int64_t lookup_hits = 0;
  int64_t hits_grid_checkpoint = 0;
  int64_t hits_exact_prefix = 0;
  int64_t checksum_failures = 0;
  int64_t expired_leases = 0;
  int64_t expired_puts = 0;
  int64_t pinned_states = 0;  // session pins
  int64_t pinned_bytes = 0;
  DiskTierUsage disk;  // CacheStore::Stats fills it
  // The shard's name (StatsResponse.shard_name) over gRPC; empty in process
  // and in a sum over shards.
  std::string shard_name;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_TYPES_H_
