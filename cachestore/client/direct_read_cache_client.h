#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READ_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READ_CACHE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/direct_reader.h"

namespace hybridserve::cachestore {

// What the direct read path has done so far (cumulative).
struct DirectReadCounts {
  std::string path;   // the reader's name: "shm" or "bulk"
  int64_t reads = 0;  // GetInto / GetManyInto / GetManyScattered calls the path served
  int64_t bytes = 0;  // entry bytes they moved
  // Calls the cachestore answered NOT_FOUND over the path (or an entry too
  // big or small for its destination).
  int64_t verdicts = 0;
  // Calls that fell back to the wrapped client, by reason
  // (common::FailureReason of the path's error: unavailable,
  // permission_denied, not_found, failed_precondition for a bad descriptor,
  // data_loss for a checksum, ...).
  std::map<std::string, int64_t> fallbacks;
};

// A CacheClient that reads entries by a direct path (DirectReader: shared
// memory on the cachestore's host, or its bulk port across hosts), and does
// everything else, and every read the direct path fails, through the client
// it wraps (the gRPC client: the control plane and the fallback). A failure
// of the direct path (no socket, a refused peer, a bad descriptor, a checksum
// that does not match, a timeout) is never the caller's error: the read is
// retried on `base` and counted in counts(). The cachestore's own verdict on
// the lease (NOT_FOUND: no such lease or key) is the answer, as over gRPC,
// and returned as it is. A stored entry that fails its checksum is the
// reader's DATA_LOSS (neither direct server verifies): the read goes to
// `base`, whose Get verifies, removes the entry and answers DATA_LOSS.
// Results and codes are `base`'s contract (cache_client.h); the bytes are
// verified against the checksums the cachestore sent, as the gRPC path does.
//
// The seam is a decorator rather than a change to GrpcCacheClient: the
// in-process client and every fake keep working unchanged beneath or without
// it, and the workers pick it by configuration (--cachestore_shm_socket,
// --cachestore_bulk_address).
//
// Thread-safe. `base` must outlive it.
class DirectReadCacheClient final : public CacheClient {
 public:
  DirectReadCacheClient(CacheClient& base, std::unique_ptr<DirectReader> reader)
      : base_(base), reader_(std::move(reader)) {
    counts_.path = reader_->name();
  }

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override {
    return base_.Lookup(ns, tokens, mode);
  }
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override {
    return base_.Put(ns, put, bytes);
  }
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override;
  // One read of the direct path for all of `keys` (up to its max_keys()).
  absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) override;
  // Straight into the caller's segments (DirectReader::ReadScattered); a
  // read the direct path fails goes to `base`'s GetManyScattered.
  absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                absl::Span<const EntrySegments> out) override;
  absl::Status Release(uint64_t lease_id) override { return base_.Release(lease_id); }
  absl::StatusOr<IndexStats> Stats() override { return base_.Stats(); }

  DirectReadCounts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Counts the outcome of a direct read of `bytes` (when it is OK):
  // OK when the path delivered every entry; the cachestore's verdict
  // (NOT_FOUND) as it is; nullopt when the read must go to `base`.
  std::optional<absl::Status> Counted(const absl::Status& read, bool verdict, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<absl::Status> TryDirect(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out);

  CacheClient& base_;
  const std::unique_ptr<DirectReader> reader_;
  mutable absl::Mutex mu_;
  DirectReadCounts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READ_CACHE_CLIENT_H_
