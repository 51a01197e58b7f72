#ifndef HYBRIDSERVE_CACHESTORE_INDEX_CACHE_STORE_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_CACHE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cachestore/index/cache_index.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"

namespace hybridserve::cachestore {

class PutSession;

// Thread-safe. Owns the index and the bytes; every index access locks mu_.
// Work proportional to entry size (copying chunks, checksums) and key hashing
// happen outside the lock.
class CacheStore {
 public:
  // `clock` must outlive the store.
  static absl::StatusOr<std::unique_ptr<CacheStore>> Create(const CacheIndexOptions& options,
                                                            const common::Clock& clock);

  const CacheIndexOptions& options() const { return options_; }

  // The resume point of `tokens` in namespace `ns` (see CacheIndex::Lookup).
  absl::StatusOr<LookupResult> Lookup(const Hash128& ns, int32_t page_size, absl::Span<const TokenId> tokens,
                                      bool lease) ABSL_LOCKS_EXCLUDED(mu_);

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

  IndexStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // CacheIndex::ModelCostOf: the model cost namespace `ns` registered.
  std::optional<PrefillCost> ModelCostOf(const Hash128& ns) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PutSession;
  CacheStore(const CacheIndexOptions& options, const common::Clock& clock);

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
