#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// A read path for leased entries beside gRPC (the control plane and the
// fallback): shared memory on the cachestore's host (ShmReader), or the bulk
// port across hosts (BulkReader). DirectReadCacheClient puts one in front of
// a gRPC client. Implementations are thread-safe.
class DirectReader {
 public:
  virtual ~DirectReader() = default;

  // "shm" or "bulk": the path's name in counters and logs.
  virtual const char* name() const = 0;
  // The most keys one read takes.
  virtual size_t max_keys() const = 0;

  // The bytes of `keys` held by lease `lease_id` into `out` (as many as
  // keys; their capacity reused), verified against the checksums the
  // cachestore sent. Errors: UNAVAILABLE (the path is down: no connection,
  // an I/O failure, a timeout); the cachestore's refusal with its code
  // (NOT_FOUND: a key outside the lease, or no lease; INVALID_ARGUMENT;
  // PERMISSION_DENIED); DATA_LOSS (an entry's bytes do not match their
  // checksum); INVALID_ARGUMENT or FAILED_PRECONDITION for a malformed answer.
  // `*verdict` (when given) is set to whether the error is the cachestore's
  // answer about the lease and its entries (NOT_FOUND, or a DATA_LOSS it
  // answered itself, or an entry that does not fit its destination): the
  // answer a gRPC read would get too, rather than a failure of the path. On
  // error `out` holds no usable bytes.
  virtual absl::Status ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                                bool* verdict = nullptr) const = 0;

  // The same, each entry straight into its caller-owned segments (in order;
  // an entry not exactly as long as they are together is INVALID_ARGUMENT
  // naming keys[i], a verdict: a gRPC read of that entry would not fit
  // either). On error the segments hold no usable bytes.
  virtual absl::Status ReadScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                     absl::Span<const EntrySegments> out, bool* verdict = nullptr) const = 0;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_READER_H_
