#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_H_

// C++ client of the cachestore service, used by prefill and decode workers,
// tests and benchmarks. Speaks domain types; protos stay inside.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// A namespace as the client names it; the server hashes it into the root key.
struct ClientNamespace {
  std::string model_fingerprint;
  std::string adapter;
  std::string cache_salt;
  int32_t page_size = 0;

  Hash128 Key() const { return NamespaceKey(model_fingerprint, adapter, cache_salt, page_size); }
};

struct ClientOptions {
  int64_t chunk_bytes = int64_t{4} << 20;      // Put chunks; also asked of Get
  absl::Duration timeout = absl::Seconds(30);  // per call
};

struct PutResult {
  Hash128 key;
  bool already_present = false;
};

// What to Put; keys are derived by the server from parent and tokens.
struct ClientPut {
  EntryClass entry_class = EntryClass::kPage;
  std::optional<Hash128> parent;  // nullopt: the namespace root
  std::vector<TokenId> tokens;    // a page's tokens, or a state's tail
  StateKind state_kind = StateKind::kExactPrefix;
  int64_t position = 0;  // states only
};

// Thread-safe (gRPC stubs are).
class CacheStoreClient {
 public:
  static absl::StatusOr<std::unique_ptr<CacheStoreClient>> Create(const std::string& target,
                                                                  const ClientOptions& options = {});
  ~CacheStoreClient();

  absl::StatusOr<LookupResult> Lookup(const ClientNamespace& ns, absl::Span<const TokenId> tokens,
                                      bool probe_only = false);
  absl::StatusOr<PutResult> Put(const ClientNamespace& ns, const ClientPut& put, absl::string_view bytes);
  // Fetches a leased entry's bytes and verifies their checksum (DATA_LOSS if not).
  absl::StatusOr<std::string> Get(uint64_t lease_id, const Hash128& key);
  // The same into `out`, reusing its capacity (no page faults when the
  // caller keeps one buffer for entries of the same size).
  absl::Status GetInto(uint64_t lease_id, const Hash128& key, std::string* out);
  absl::Status Release(uint64_t lease_id);
  absl::StatusOr<IndexStats> Stats();

 private:
  struct Impl;
  explicit CacheStoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_H_
