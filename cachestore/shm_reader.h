#ifndef HYBRIDSERVE_CACHESTORE_SHM_READER_H_
#define HYBRIDSERVE_CACHESTORE_SHM_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "cachestore/shm_protocol.h"
#include "common/hash.h"

namespace hybridserve::cachestore {

// The entries of one shared-memory read: a read-only private mapping of the
// sealed memfd the cachestore sent, with every entry's bytes verified against
// its checksum. Move-only; unmaps on destruction (the kernel frees the memfd
// when its last mapping and descriptor are gone). Not thread-safe.
class ShmEntries {
 public:
  ShmEntries() = default;
  ShmEntries(ShmEntries&& other) noexcept;
  ShmEntries& operator=(ShmEntries&& other) noexcept;
  ~ShmEntries();

  size_t size() const { return entries_.size(); }
  // Entry i of the request's keys; valid while this object lives.
  absl::string_view entry(size_t i) const { return entries_[i]; }
  // The mapped bytes (the entries and their alignment padding).
  uint64_t mapped_bytes() const { return mapped_size_; }

 private:
  friend class ShmReader;
  void* mapped_ = nullptr;
  uint64_t mapped_size_ = 0;
  std::vector<absl::string_view> entries_;
};

struct ShmReaderOptions {
  std::string socket_path;
  // Connect, request and response each.
  absl::Duration timeout = absl::Seconds(10);
};

// Reads leased entries by shared memory from a cachestore's shm socket
// (shm_protocol.h). One connection per read. Thread-safe (holds no state).
class ShmReader {
 public:
  explicit ShmReader(ShmReaderOptions options) : options_(std::move(options)) {}

  // The bytes of `keys` (1 .. kShmMaxKeys) held by lease `lease_id`. Errors:
  // UNAVAILABLE (no socket, connection or I/O failed, timeout); the
  // cachestore's refusal with its code (PERMISSION_DENIED: this process's uid
  // is not allowed; NOT_FOUND: a key outside the lease, or no lease; DATA_LOSS:
  // a stored entry failed its checksum; RESOURCE_EXHAUSTED); FAILED_PRECONDITION
  // (a bad descriptor: not sealed, wrong size, entries outside it);
  // DATA_LOSS (an entry's bytes do not match its checksum); INVALID_ARGUMENT
  // (no keys or too many, a malformed response). `*verdict` (when given) is
  // set to whether the error is the cachestore's answer about the lease and
  // its entries (NOT_FOUND, or DATA_LOSS of a stored entry, which it removed):
  // the answer a gRPC read would get too, rather than a failure of the path.
  absl::StatusOr<ShmEntries> Read(uint64_t lease_id, absl::Span<const Hash128> keys, bool* verdict = nullptr) const;

  // The same, copied with pread straight into `out` (as many as keys; their
  // capacity reused) and verified there: no mapping to set up and tear down,
  // so the one copy a caller needing its own bytes makes is the only cost
  // (shm_bench). On error `out` holds no usable bytes.
  absl::Status ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                        bool* verdict = nullptr) const;

 private:
  // Request, response, and the descriptor's checks (sealed, its size);
  // *memfd a descriptor the caller owns (-1 when there are no bytes).
  absl::StatusOr<ShmResponse> Receive(uint64_t lease_id, absl::Span<const Hash128> keys, bool* verdict,
                                      int* memfd) const;

  const ShmReaderOptions options_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SHM_READER_H_
