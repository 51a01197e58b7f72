#ifndef HYBRIDSERVE_CACHESTORE_INDEX_CACHE_STORE_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_CACHE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cachestore/index/cache_index.h"
#include "cachestore/index/disk_tier_cache.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"

namespace hybridserve::cachestore {

class PutSession;

// Thread-safe. Owns the index and the bytes; every index access locks mu_.
// Work proportional to entry size (copying chunks, checksums, disk I/O) and
// key hashing happen outside the lock.
//
// With a disk tier (docs/ARCHITECTURE.md section 4, "The disk tier"), the
// entries the index evicts to make room are queued for the disk
// (DiskTierCache), and a lookup that finds a deeper resume point on disk
// reads those entries back through the normal put path before it answers.
// Without one, every result is the memory index's alone.
class CacheStore {
 public:
  // `clock` must outlive the store. `disk.directory` empty: no disk tier;
  // otherwise the directory is opened and its entries are found by lookups
  // (a warm restart). A refusal names the option.
  static absl::StatusOr<std::unique_ptr<CacheStore>> Create(const CacheIndexOptions& options,
                                                            const common::Clock& clock,
                                                            const DiskTierCacheOptions& disk = {});

  const CacheIndexOptions& options() const { return options_; }

  // The resume point of `tokens` in namespace `ns` (see CacheIndex::Lookup).
  // With a disk tier: when the disk holds a state deeper than the memory's
  // resume point whose pages are in memory or on disk, those pages and the
  // state are read, verified and put back into memory (budgets and eviction
  // as for any put; a failed read or put is only a miss), then the memory
  // index answers; pages_from_disk and state_from_disk say what came back.
  absl::StatusOr<LookupResult> Lookup(const Hash128& ns, int32_t page_size, absl::Span<const TokenId> tokens,
                                      bool lease) ABSL_LOCKS_EXCLUDED(mu_);

  // Shutdown: writes every committed entry not yet on disk, most recently
  // used first, within the disk budget and the disk tier's
  // shutdown_spill_timeout (by the store's clock); the queued evictions are
  // dropped. Returns the entries written; 0 without a disk tier.
  int64_t SpillToDisk() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the evicted entries queued so far are on disk (or dropped).
  // For tests and benchmarks; a no-op without a disk tier.
  void FlushDiskWrites();
  bool has_disk_tier() const { return disk_ != nullptr; }

  // Starts a put. When the entry is already committed the session reports
  // already_present() and accepts no bytes.
  absl::StatusOr<std::unique_ptr<PutSession>> BeginPut(const PutSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  // The bytes of a leased entry after verifying their checksum. DATA_LOSS (and
  // the entry is removed) when they do not match.
  absl::StatusOr<ReadHandle> OpenVerified(uint64_t lease_id, const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The same without the checksum: for the shared-memory read path, whose
  // reader verifies every entry and takes a mismatch to gRPC, whose read
  // verifies and removes (docs/ARCHITECTURE.md section 4).
  absl::StatusOr<ReadHandle> Open(uint64_t lease_id, const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);
  // For a reader that hashes an opened entry's bytes as it serves them (gRPC
  // Get): `actual` is their XXH3-64. DATA_LOSS (and the entry is removed, as
  // by OpenVerified) when it is not the entry's checksum.
  absl::Status CheckIntact(const ReadHandle& h, uint64_t actual) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Release(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Expires leases, stalled puts and idle entries as of the clock's now.
  // Returns the reservation ids of the reclaimed puts.
  std::vector<uint64_t> Expire() ABSL_LOCKS_EXCLUDED(mu_);

  // The index's numbers, and the disk tier's in `disk`.
  IndexStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // CacheIndex::ModelCostOf: the model cost namespace `ns` registered.
  std::optional<PrefillCost> ModelCostOf(const Hash128& ns) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PutSession;
  CacheStore(const CacheIndexOptions& options, const common::Clock& clock, std::unique_ptr<DiskTierCache> disk);

  // What a lookup reads back from disk (cache_store_tiers.cc): the pages at
  // depths (first_page_depth, state_depth] and the state at state_depth
  // with a tail of tail_length tokens.
  struct Promotion {
    int64_t first_page_depth = 0;
    int64_t state_depth = 0;
    int64_t tail_length = 0;
    Hash128 state_key;
  };
  std::optional<Promotion> PlanPromotion(const Hash128& ns, int32_t page_size, absl::Span<const Hash128> keys,
                                         absl::Span<const TokenId> tokens, const LookupResult& memory) const;
  // Puts the plan's entries back; returns how many pages and whether the
  // state went in (or were found present).
  std::pair<int64_t, bool> Promote(const Promotion& plan, const Hash128& ns, int32_t page_size,
                                   absl::Span<const Hash128> keys, absl::Span<const TokenId> tokens);
  // One entry read from disk into memory through BeginPut, Write, Commit.
  // `key` is what the put must produce.
  absl::Status PutBack(const PutSpec& spec, const Hash128& key, const DiskTierRead& read);

  absl::Status TouchPut(uint64_t reservation_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CommitPut(uint64_t reservation_id, uint64_t checksum) ABSL_LOCKS_EXCLUDED(mu_);
  void AbortPut(uint64_t reservation_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Logs that a put registered its namespace's model cost: one line per
  // distinct cost per 10 s (namespaces of one model share a cost), with the
  // count of those held back.
  void LogModelCost(const PutSpec& spec);

  const CacheIndexOptions options_;  // immutable copy, readable without mu_
  const common::Clock& clock_;
  mutable absl::Mutex mu_;
  CacheIndex index_ ABSL_GUARDED_BY(mu_);
  common::LogRateLimiter model_cost_log_;
  // Null without a disk tier. Thread-safe itself; never called under mu_.
  const std::unique_ptr<DiskTierCache> disk_;
};

// One put in progress: header accepted, bytes arriving in order, then commit.
// Not thread-safe (one writer). Destroying a session that has not committed
// aborts the put and frees its reservation. The store must outlive it.
class PutSession {
 public:
  ~PutSession();
  PutSession(const PutSession&) = delete;
  PutSession& operator=(const PutSession&) = delete;

  const Hash128& key() const { return reservation_.key; }
  // What the index granted (key, retention); the blob is the put's.
  const Reservation& reservation() const { return reservation_; }
  bool already_present() const { return reservation_.already_present; }
  uint64_t reservation_id() const { return reservation_.id; }
  int64_t size_bytes() const { return size_bytes_; }
  int64_t bytes_written() const { return written_; }

  // Appends `data` at `offset`, which must equal bytes_written(). Only a
  // non-empty chunk is progress (extends the put's put_timeout deadline).
  // INVALID_ARGUMENT: out of order, or past the declared size.
  // ABORTED: the put was reclaimed.
  absl::Status Write(int64_t offset, absl::string_view data);
  // The same for `size` bytes that `fill` copies to the pointer it is given
  // (straight from a transport's buffers, without a contiguous copy first).
  absl::Status WriteWith(int64_t offset, int64_t size, absl::FunctionRef<void(uint8_t*)> fill);
  // The same with a `fill` that can fail (a socket read): its error is
  // returned, and nothing of the range counts as written.
  absl::Status Append(int64_t offset, int64_t size, absl::FunctionRef<absl::Status(uint8_t*)> fill);
  // The same for `size` bytes of the file `src_fd` at `src_offset` (a put by
  // shared memory). Into a fresh slot of a shared-memory slab the kernel
  // copies them file to file (copy_file_range): no page of the entry is
  // faulted in and zeroed first, as a copy through the mapping would; into a
  // recycled buffer, whose pages are resident, pread. INVALID_ARGUMENT
  // also when the file ends early or cannot be read (nothing of the range
  // counts as written).
  absl::Status WriteFromFile(int64_t offset, int64_t size, int src_fd, uint64_t src_offset);

  // Verifies the XXH3-64 of the stored bytes against `checksum` and makes the
  // entry visible. INVALID_ARGUMENT: not all bytes arrived. DATA_LOSS:
  // checksum mismatch (the put is aborted). ABORTED: reclaimed.
  absl::Status Commit(uint64_t checksum);

 private:
  friend class CacheStore;
  PutSession(CacheStore* store, Reservation reservation, int64_t size_bytes);

  CacheStore* const store_;
  Reservation reservation_;
  const int64_t size_bytes_;
  int64_t written_ = 0;
  common::StreamingChecksum checksum_;
  bool finished_ = false;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_CACHE_STORE_H_
