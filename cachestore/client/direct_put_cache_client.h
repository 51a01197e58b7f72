#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_PUT_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_PUT_CACHE_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/cache_client.h"
#include "cachestore/client/direct_writer.h"
#include "common/log_rate_limiter.h"

namespace hybridserve::cachestore {

// What the direct put path has done so far (cumulative).
struct DirectPutCounts {
  std::string path;     // the writer's name: "shm" or "bulk"
  int64_t calls = 0;    // Put / PutMany calls the path answered in full
  int64_t entries = 0;  // entries it answered (stored, already present or refused)
  int64_t bytes = 0;    // entry bytes it carried
  // Calls that went on over `base` (from the first entry the path did not
  // answer), by reason (common::FailureReason of the path's error).
  std::map<std::string, int64_t> fallbacks;
};

// A CacheClient that puts entries by a direct path (DirectWriter: shared
// memory on the cachestore's host, or its bulk port across hosts), and does
// everything else, and every put the path fails, through the client it wraps
// (the gRPC client, or a DirectReadCacheClient over it): the control plane
// and the fallback. Over gRPC the same bytes take a copy into the stream, HTTP/2
// framing, and a copy out of gRPC's buffers on the other end.
//
// The answers are PutMany's (cache_client.h): one per entry, in order; a
// refused entry (FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ABORTED, DATA_LOSS,
// INVALID_ARGUMENT) is the cachestore's answer and returned as it is. A
// failure of the path is never the caller's error: the entries not yet
// answered go to `base`'s PutMany, counted in counts(). An entry the
// cachestore committed before the path failed is already_present there.
//
// Thread-safe. `base` must outlive it.
class DirectPutCacheClient final : public CacheClient {
 public:
  DirectPutCacheClient(CacheClient& base, std::unique_ptr<DirectWriter> writer);

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override {
    return base_.Lookup(ns, tokens, mode);
  }
  // PutMany of one entry.
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override;
  std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                 absl::Span<const PutManyEntry> entries) override;
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override {
    return base_.GetInto(lease_id, key, out);
  }
  absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) override {
    return base_.GetManyInto(lease_id, keys, out);
  }
  absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                absl::Span<const EntrySegments> out) override {
    return base_.GetManyScattered(lease_id, keys, out);
  }
  absl::Status Release(uint64_t lease_id) override { return base_.Release(lease_id); }
  absl::StatusOr<IndexStats> Stats() override { return base_.Stats(); }

  DirectPutCounts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CacheClient& base_;
  const std::unique_ptr<DirectWriter> writer_;
  mutable absl::Mutex mu_;
  DirectPutCounts counts_ ABSL_GUARDED_BY(mu_);
  common::LogRateLimiter log_limiter_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_PUT_CACHE_CLIENT_H_
