#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_IN_PROCESS_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_IN_PROCESS_CACHE_CLIENT_H_

// The in-process CacheClient: calls a CacheStore in this process directly, with
// the same checks, results and status codes as the gRPC service and client
// (no socket, no serialization). For aggregated mode and for service tests.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "cachestore/index/cache_store.h"

namespace hybridserve::cachestore {

// Thread-safe: it holds no mutable state of its own, and CacheStore is
// thread-safe. Never fails with a transport code (UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELLED).
class InProcessCacheClient final : public CacheClient {
 public:
  // `store` must outlive the client.
  explicit InProcessCacheClient(CacheStore& store);

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override;
  // Writes `bytes` in one piece and commits them with their XXH3-64, which
  // the store checks against what it copied.
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override;
  // Each entry as Put, committed with the entry's checksum when it gives one
  // (the store checks it against what it copied, as the service does).
  std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                 absl::Span<const PutManyEntry> entries) override;
  // Copies the verified bytes into `*out`.
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override;
  absl::Status Release(uint64_t lease_id) override;
  absl::StatusOr<IndexStats> Stats() override;

 private:
  // Put with the checksum the commit claims.
  absl::StatusOr<PutResult> PutChecked(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes,
                                       uint64_t checksum);

  CacheStore& store_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_IN_PROCESS_CACHE_CLIENT_H_
