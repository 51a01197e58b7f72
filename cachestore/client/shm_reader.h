#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_SHM_READER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_SHM_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/client/direct_reader.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"
#include "cachestore/wire/shm_protocol.h"
#include "common/hash.h"

namespace hybridserve::cachestore {

struct ShmReaderOptions {
  std::string socket_path;
  // Connect, and each request and response.
  absl::Duration timeout = absl::Seconds(10);
};

// The same bound as GetMany's (proto/cachestore.proto): keys one ReadInto
// takes, split into requests of kShmMaxKeys on one connection.
inline constexpr size_t kShmMaxReadKeys = 4096;

// Reads leased entries by shared memory from a cachestore's shm socket
// (shm_protocol.h, version 2). One connection per read. Thread-safe (holds no
// state).
//
// There is no mapped view: the descriptors are of whole slabs whose slots
// are reused once the lease ends, so bytes are copied out (preadv, one call
// per entry) into the caller's memory and verified there while the lease is
// held, and every received descriptor is closed before a read returns, on
// every path.
class ShmReader final : public DirectReader {
 public:
  explicit ShmReader(ShmReaderOptions options) : options_(std::move(options)) {}

  const char* name() const override { return "shm"; }
  size_t max_keys() const override { return kShmMaxReadKeys; }

  // The bytes of `keys` (1 .. kShmMaxReadKeys) held by lease `lease_id`,
  // copied with pread straight into `out` (as many as keys; their capacity
  // reused) and verified there. Errors: UNAVAILABLE (no socket, connection or
  // I/O failed, timeout); the cachestore's refusal with its code
  // (PERMISSION_DENIED: this process's uid is not allowed; NOT_FOUND: a key
  // outside the lease, or no lease; INVALID_ARGUMENT; RESOURCE_EXHAUSTED);
  // FAILED_PRECONDITION (a bad descriptor: not a regular file, not opened
  // read-only, an entry outside it); DATA_LOSS (an entry's bytes do not match
  // its checksum: corrupt in the store, or its slot reused because the lease
  // ended); INVALID_ARGUMENT (no keys or too many, a malformed response).
  // `*verdict` (when given) is set to whether the error is the cachestore's
  // answer about the lease and its entries (NOT_FOUND, or a DATA_LOSS it
  // answered itself): the answer a gRPC
  // read would get too, rather than a failure of the path. On error `out`
  // holds no usable bytes.
  absl::Status ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                        bool* verdict = nullptr) const override;

  // The same, each entry straight into its caller-owned segments (in order;
  // an entry not exactly as long as they are together is INVALID_ARGUMENT
  // naming keys[i], a verdict: a gRPC read of that entry would not fit
  // either), verified there. On error the segments hold no usable bytes.
  absl::Status ReadScattered(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<const EntrySegments> out,
                             bool* verdict = nullptr) const override;

 private:
  // Where entry `index` of a read goes, once its size is known: the segments
  // it fills, in order (their sizes add up to `size`), or an error.
  using Destination =
      absl::FunctionRef<absl::Status(size_t index, uint64_t size, std::vector<absl::Span<char>>* segments)>;

  absl::Status Read(uint64_t lease_id, absl::Span<const Hash128> keys, Destination destination, bool* verdict) const;
  // One request of at most kShmMaxKeys keys on the connection `sock`; its
  // entries are the read's from `first_index` on.
  absl::Status ReadChunk(int sock, uint64_t lease_id, absl::Span<const Hash128> keys, Destination destination,
                         size_t first_index, bool* verdict) const;

  const ShmReaderOptions options_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_SHM_READER_H_
