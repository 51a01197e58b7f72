#ifndef HYBRIDSERVE_CACHESTORE_BULK_PROTOCOL_H_
#define HYBRIDSERVE_CACHESTORE_BULK_PROTOCOL_H_

// The bulk read path's wire format, version 1 (docs/ARCHITECTURE.md section 4,
// "Reads over the bulk port"): a worker reads the entries of a lease it holds
// over a plain TCP connection to the cachestore's --bulk_address, the bytes
// inline, off the gRPC stream: one kernel copy on each end, as a raw socket
// (gRPC adds HTTP/2 framing and a copy out of its own buffers).
//
// One connection carries requests one after another; each request gets one
// response before the next is read. All integers little-endian.
//
//   request   u32 magic 0x31425348 ("HSB1")
//             u32 key_count            1 .. kBulkMaxKeys
//             u64 lease_id             from a leasing gRPC Lookup
//             key_count x 16 bytes     entry keys (Hash128::ToBytes)
//
//   response  u32 magic 0x31425348
//             u32 code                 absl::StatusCode: 0 OK, else the
//                                      read's status (NOT_FOUND,
//                                      INVALID_ARGUMENT)
//             u32 entry_count          key_count when OK, 0 otherwise
//             u32 message_bytes        <= kBulkMaxMessageBytes
//             message_bytes bytes      the status message (empty when OK)
//             entry_count x (u64 size, u64 checksum)
//                                      entry i of the request: `size` bytes
//                                      whose XXH3-64 must be `checksum`
//             then the entries' bytes, back to back in the request's order
//
// The server sends the bytes as the store holds them, without checking them
// (as the shared-memory path); the reader verifies every entry as it arrives,
// and takes a mismatch to gRPC, whose Get verifies, removes the entry and
// answers DATA_LOSS.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

inline constexpr uint32_t kBulkMagic = 0x31425348;  // "HSB1"
// GetMany's bound (proto/cachestore.proto).
inline constexpr uint32_t kBulkMaxKeys = 4096;
inline constexpr uint32_t kBulkMaxMessageBytes = 4096;
inline constexpr size_t kBulkRequestHeaderBytes = 16;
inline constexpr size_t kBulkResponseHeaderBytes = 16;
inline constexpr size_t kBulkEntryBytes = 16;
// The largest entry a reader accepts (the gRPC client's bound).
inline constexpr uint64_t kBulkMaxEntryBytes = uint64_t{1} << 40;

struct BulkRequest {
  uint64_t lease_id = 0;
  std::vector<Hash128> keys;
};

struct BulkEntry {
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// A response's head: its status, and when OK every entry's size and
// checksum (the bytes follow it on the connection).
struct BulkResponseHead {
  absl::Status status;
  std::vector<BulkEntry> entries;
};

std::string EncodeBulkRequest(const BulkRequest& request);

// Reads one request by `deadline`. UNAVAILABLE: the peer closed the
// connection or the I/O failed; DEADLINE_EXCEEDED; INVALID_ARGUMENT: a
// malformed request (bad magic, no keys or more than kBulkMaxKeys).
absl::StatusOr<BulkRequest> ReadBulkRequest(common::Socket& socket, absl::Time deadline);

// The head of a response (`entries` only when the status is OK; a message is
// cut to kBulkMaxMessageBytes).
std::string EncodeBulkResponseHead(const BulkResponseHead& head);

// Reads the head of the response to a request of `key_count` keys.
// INVALID_ARGUMENT: a malformed head (bad magic, an unknown code, an OK one
// with another entry count than key_count or an entry over
// kBulkMaxEntryBytes, a long message); the socket's errors otherwise.
absl::StatusOr<BulkResponseHead> ReadBulkResponseHead(common::Socket& socket, size_t key_count, absl::Time deadline);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_BULK_PROTOCOL_H_
