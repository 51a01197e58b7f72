#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_WRITER_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cachestore/cache_client.h"

namespace hybridserve::cachestore {

// A put path for entries beside gRPC (the control plane and the fallback):
// shared memory on the cachestore's host (ShmWriter), or the bulk port across
// hosts (BulkWriter). DirectPutCacheClient puts one in front of a client.
// Implementations are thread-safe.
class DirectWriter {
 public:
  virtual ~DirectWriter() = default;

  // "shm" or "bulk": the path's name in counters and logs.
  virtual const char* name() const = 0;

  // Puts `entries` in namespace `ns`, appending to
  // *results one result per entry the cachestore answered, in order: what
  // PutMany answers for it (a refusal of the entry is its result). An error
  // when the path failed (no connection, an I/O failure, a timeout, a
  // refused request, a malformed answer): *results then holds the entries
  // answered before it, and the rest are the caller's to put another way.
  virtual absl::Status Put(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                           std::vector<absl::StatusOr<PutResult>>* results) = 0;
};

// The requests `entries` go in, as [begin, end) index ranges in order: at
// most `max_entries` entries and `max_bytes` of entry bytes each (an entry
// larger than that alone), and headers (about 64 bytes and 8 a token) of at
// most `max_header_bytes`; each with at least one entry.
std::vector<std::pair<size_t, size_t>> SplitPutRequests(absl::Span<const PutManyEntry> entries, size_t max_entries,
                                                        int64_t max_bytes, size_t max_header_bytes);

// The answers of a request of `entries` (serialized v1::PutManyResponse, one
// per entry, in order) appended to *results as PutMany's results.
// INVALID_ARGUMENT (a failed path) for another count, an answer out of order
// or malformed; the answers before it are appended.
absl::Status AppendPutAnswers(absl::Span<const std::string> answers, size_t entries,
                              std::vector<absl::StatusOr<PutResult>>* results);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_DIRECT_WRITER_H_
