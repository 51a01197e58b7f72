#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_GRPC_CACHE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_GRPC_CACHE_CLIENT_H_

// The gRPC CacheClient: reaches a cachestore service (cachestore/server/server.h) over
// the network. Used by prefill and decode workers, tests, tools and
// benchmarks. Speaks domain types; protos stay inside.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "cachestore/types.h"
#include "common/tls.h"

namespace hybridserve::cachestore {
namespace grpc_client_internal {
class ArrivingEntry;  // grpc_cache_client.cc: one entry of a stream as it arrives
}  // namespace grpc_client_internal

struct GrpcCacheClientOptions {
  // Put chunks; also asked of Get. 1 MiB: Put of 64 MiB over loopback ran at
  // 0.81-0.88x raw TCP with 1 MiB chunks, 0.62-0.65x with 4 MiB
  // (transfer_bench, before checksums rode along with the chunks); Get the
  // same at both.
  int64_t chunk_bytes = int64_t{1} << 20;
  absl::Duration timeout = absl::Seconds(30);  // per call
  // The longest wait between reconnection attempts while the cachestore is
  // unreachable. gRPC's own default grows to 120 s: a cachestore back after
  // a restart stayed refused for seconds (13 s of misses seen). With 1 s,
  // calls succeed again within about a second of its return.
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // TLS to the cachestore (mutual TLS with a client certificate); off when
  // tls.ca_file is empty.
  common::ChannelTlsOptions tls;
};

// Thread-safe (gRPC stubs are). Besides the codes of CacheClient, any call may
// fail with the transport's: UNAVAILABLE (cachestore down or unreachable),
// DEADLINE_EXCEEDED (past options.timeout), CANCELLED.
class GrpcCacheClient final : public CacheClient {
 public:
  // `target` is a gRPC target ("host:port"). INVALID_ARGUMENT: chunk_bytes
  // outside (0, 64 MiB], or TLS options that cannot work (common/tls.h). Connects lazily: an unreachable target shows
  // as UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<GrpcCacheClient>> Create(const std::string& target,
                                                                 const GrpcCacheClientOptions& options = {});
  ~GrpcCacheClient() override;

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      LookupMode mode) override;
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes) override;
  // One PutMany stream; the entries' chunks point into their bytes (no copy),
  // and the answers are read while the entries are written.
  std::vector<absl::StatusOr<PutResult>> PutMany(const ClientNamespace& ns,
                                                 absl::Span<const PutManyEntry> entries) override;
  // Streams the entry in chunks and verifies size and checksum on arrival
  // (DATA_LOSS if they do not match). Reusing one `out` for entries of the
  // same size avoids page faults.
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out) override;
  // One GetMany stream.
  absl::Status GetManyInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out) override;
  // One GetMany stream whose chunks are copied straight from gRPC's slices
  // into the caller's segments (no string in between).
  absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                absl::Span<const EntrySegments> out) override;
  absl::Status Release(uint64_t lease_id) override;
  absl::StatusOr<IndexStats> Stats() override;

 private:
  struct Impl;
  explicit GrpcCacheClient(std::unique_ptr<Impl> impl);
  // One GetMany stream, entry i arriving into entry_for(i).
  absl::Status GetManyStream(uint64_t lease_id, absl::Span<const Hash128> keys,
                             absl::FunctionRef<grpc_client_internal::ArrivingEntry(size_t index)> entry_for);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_GRPC_CACHE_CLIENT_H_
