#ifndef HYBRIDSERVE_CACHESTORE_SHM_PUT_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_SHM_PUT_CACHE_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cachestore/cache_client.h"
#include "common/log_rate_limiter.h"
#include "proto/cachestore.pb.h"

namespace hybridserve::cachestore {

struct ShmPutOptions {
  std::string socket_path;  // the cachestore's --shm_socket
  // Connect, and each request and answer.
  absl::Duration timeout = absl::Seconds(10);
  // Entry bytes one request carries (an entry larger than this goes alone).
  int64_t request_bytes = int64_t{16} << 20;
  // Memfds kept between calls, so that a put writes into pages it already
  // has rather than into new ones the kernel must allocate and zero (for a
  // 64 MiB entry, twice the time of the rest of the put): at most
  // kept_memfds of them, holding at most kept_bytes together (a memfd that
  // would pass it is closed after its call). They are this process's memory.
  int kept_memfds = 2;
  int64_t kept_bytes = int64_t{256} << 20;
};

// What the shm put path has done so far (cumulative).
struct ShmPutCounts {
  int64_t calls = 0;    // Put / PutMany calls the socket answered in full
  int64_t entries = 0;  // entries it answered (stored, already present or refused)
  int64_t bytes = 0;    // entry bytes it carried
  // Calls that went on over `base` (from the first entry the socket did not
  // answer), by reason (common::FailureReason of the path's error).
  std::map<std::string, int64_t> fallbacks;
};

// A CacheClient that puts entries through the cachestore's shm socket when
// the two share a host (shm_protocol.h, "HSP1"), and does everything else,
// and every put the socket fails, through the client it wraps (the gRPC
// client, or a DirectReadCacheClient over it): the control plane and the
// fallback. The entries' bytes are copied into a mapped memfd of this
// process (hashed as they are copied) and its descriptor sent; the
// cachestore copies each entry once from it into the entry's place and
// verifies it against its checksum there. Over gRPC the
// same bytes take a copy into the stream, two kernel copies through a socket
// and a copy into the entry.
//
// The answers are PutMany's (cache_client.h): one per entry, in order; a
// refused entry (FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ABORTED, DATA_LOSS,
// INVALID_ARGUMENT) is the cachestore's answer and returned as it is. A
// failure of the path (no socket, a refused peer, an I/O error or a timeout,
// a malformed answer) is never the caller's error: the entries not yet
// answered go to `base`'s PutMany, counted in counts(). An entry the
// cachestore committed before the path failed is already_present there.
//
// Thread-safe. `base` must outlive it.
class ShmPutCacheClient final : public CacheClient {
 public:
  ShmPutCacheClient(CacheClient& base, ShmPutOptions options);
  ~ShmPutCacheClient() override;
  ShmPutCacheClient(const ShmPutCacheClient&) = delete;
  ShmPutCacheClient& operator=(const ShmPutCacheClient&) = delete;

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

  ShmPutCounts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Puts `entries` on the connection `sock`, appending one result per entry
  // to *results; an error when the path failed (the results then cover the
  // entries answered before it).
  absl::Status PutOnSocket(int sock, const v1::CacheNamespace& ns, absl::Span<const PutManyEntry> entries,
                           std::vector<absl::StatusOr<PutResult>>* results);
  // One request of `entries` (within the request limits).
  absl::Status PutRequest(int sock, const v1::CacheNamespace& ns, absl::Span<const PutManyEntry> entries,
                          std::vector<absl::StatusOr<PutResult>>* results);
  // A memfd of this process, mapped, that a request's bytes are written into.
  class PutBuffer;
  // A buffer of at least `size` bytes to write a request into (a kept one,
  // grown if need be, or a new one), and back after its request's answer.
  absl::StatusOr<std::unique_ptr<PutBuffer>> TakeBuffer(size_t size) ABSL_LOCKS_EXCLUDED(mu_);
  void KeepBuffer(std::unique_ptr<PutBuffer> buffer) ABSL_LOCKS_EXCLUDED(mu_);

  CacheClient& base_;
  const ShmPutOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<PutBuffer>> kept_ ABSL_GUARDED_BY(mu_);
  ShmPutCounts counts_ ABSL_GUARDED_BY(mu_);
  common::LogRateLimiter log_limiter_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SHM_PUT_CACHE_CLIENT_H_
