#ifndef HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_CACHE_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_CACHE_H_

// The disk tier as a CacheStore uses it (docs/ARCHITECTURE.md section 4, "The
// disk tier"): a DiskTier (disk_tier.h) holding evicted entries with their
// SpillRecord as metadata, a bounded queue of entries waiting to be written,
// drained by one writer thread, and an index of the states on disk by the
// key they hang from, so a lookup finds a state on disk hashing its prompt
// once per tail length, as the memory index does.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/index/disk_tier.h"
#include "cachestore/index/spill_record.h"
#include "cachestore/keys.h"

namespace hybridserve::cachestore {

struct DiskTierCacheOptions {
  // Empty: no disk tier.
  std::string directory;
  // Whole files (header, record, bytes), as DiskTier counts them.
  int64_t budget_bytes = int64_t{64} << 30;
  // Bytes of evicted entries waiting for the writer (their blobs stay alive
  // meanwhile); an entry beyond it is dropped and counted.
  int64_t write_queue_bytes = int64_t{256} << 20;
  // CacheStore::SpillToDisk's time at shutdown.
  absl::Duration shutdown_spill_timeout = absl::Seconds(20);
  // Threads one promotion reads its entries on (ReadMany): a resume's pages
  // are a file each, and a disk serves many small reads in parallel far
  // faster than one after another (bench/cachestore/results/disk_tier.md).
  int read_parallelism = 16;
};

// One entry read back from disk, verified by DiskTier (body checksum) and
// decoded; the store's commit verifies `payload` against record.checksum.
struct DiskTierRead {
  SpillRecord record;
  std::string payload;
};

// Thread-safe. The writer thread runs from Open until destruction or
// StopWriter; a queued entry not written by then is dropped (counted).
class DiskTierCache {
 public:
  // Opens (and rebuilds) the directory: DiskTier::Open, then the state index
  // from the records. An entry whose record does not decode is erased.
  // INVALID_ARGUMENT naming the option for a bad value; DiskTier::Open's
  // errors otherwise.
  static absl::StatusOr<std::unique_ptr<DiskTierCache>> Open(const DiskTierCacheOptions& options);
  ~DiskTierCache();
  DiskTierCache(const DiskTierCache&) = delete;
  DiskTierCache& operator=(const DiskTierCache&) = delete;

  const DiskTierCacheOptions& options() const { return options_; }

  // Queues entries for the writer, in order. An entry already on disk or
  // queued is skipped (entries on disk are not rewritten); one that would
  // take the queue past write_queue_bytes, or arrives after StopWriter, is
  // dropped and counted.
  void Enqueue(std::vector<SpilledEntry> entries) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the disk holds `key` (reads no file; not a use).
  bool Contains(const Hash128& key) const;

  // The states on disk hanging from `parent` (a page key, or N) whose tails
  // are prefixes of `rest`: (tail length, state key), longest first. The
  // caller checks the read record's tail against its tokens.
  std::vector<std::pair<int64_t, Hash128>> StateCandidates(const Hash128& parent, absl::Span<const TokenId> rest) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The entry under `key`, verified and decoded. NOT_FOUND for none, for a
  // file that fails verification (removed), and for a record that does not
  // decode or whose size is not its bytes' (erased); all but the first are
  // counted as read failures.
  absl::StatusOr<DiskTierRead> Read(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Read of each of `keys`, on up to options().read_parallelism threads
  // (the calling one among them); results in the order of `keys`.
  std::vector<absl::StatusOr<DiskTierRead>> ReadMany(absl::Span<const Hash128> keys) ABSL_LOCKS_EXCLUDED(mu_);

  // Erases an entry the caller found unusable (a commit's checksum failed).
  void EraseBad(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Counts `bytes` promoted into memory by a lookup.
  void CountPromotion(int64_t entries, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the queue is empty and no write is in flight.
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the writer after its write in flight; what is queued is dropped
  // (counted). Later Enqueues drop. Idempotent.
  void StopWriter() ABSL_LOCKS_EXCLUDED(mu_);

  // Shutdown: stops the writer, then writes `mru_first` in that order,
  // skipping entries on disk, until one would take the entries considered
  // (on disk or written) past the disk budget, or `out_of_time` says so
  // (asked before each write). Returns the entries written.
  int64_t WriteAll(absl::Span<const SpilledEntry> mru_first, absl::FunctionRef<bool()> out_of_time)
      ABSL_LOCKS_EXCLUDED(mu_);

  DiskTierUsage Usage() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit DiskTierCache(const DiskTierCacheOptions& options);

  // Writes one entry (DiskTier::Put) and files it; true when written.
  bool Write(const SpilledEntry& entry) ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void AddStateLocked(const SpillRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static uint64_t FileBytes(const SpilledEntry& e);

  const DiskTierCacheOptions options_;
  std::unique_ptr<DiskTier> tier_;
  std::thread writer_;

  mutable absl::Mutex mu_;
  std::deque<SpilledEntry> queue_ ABSL_GUARDED_BY(mu_);
  // Keys queued or being written, so an entry is queued once.
  absl::flat_hash_map<Hash128, int> pending_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // queued and in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // States on disk: each one's parent and tail length, and per parent the
  // tail lengths present with their counts.
  struct StateLocation {
    Hash128 parent;
    int64_t tail_length = 0;
  };
  absl::flat_hash_map<Hash128, StateLocation> states_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Hash128, std::map<int64_t, int>> tail_lengths_ ABSL_GUARDED_BY(mu_);
  DiskTierUsage counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_CACHE_H_
