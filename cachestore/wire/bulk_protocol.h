#ifndef HYBRIDSERVE_CACHESTORE_WIRE_BULK_PROTOCOL_H_
#define HYBRIDSERVE_CACHESTORE_WIRE_BULK_PROTOCOL_H_

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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "cachestore/wire/put_answers.h"
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

// The head of a response (`entries` only when the status is OK; a message is
// cut to kBulkMaxMessageBytes).
std::string EncodeBulkResponseHead(const BulkResponseHead& head);

// Reads the head of the response to a request of `key_count` keys.
// INVALID_ARGUMENT: a malformed head (bad magic, an unknown code, an OK one
// with another entry count than key_count or an entry over
// kBulkMaxEntryBytes, a long message); the socket's errors otherwise.
absl::StatusOr<BulkResponseHead> ReadBulkResponseHead(common::Socket& socket, size_t key_count, absl::Time deadline);

// ---- Puts ("HBP1") ----
//
// A worker puts entries over the same port (a connection may carry reads and
// puts, one after another), their bytes off the gRPC stream: the cachestore
// receives each entry straight into its reservation, hashing it as it lands,
// and commits it against the checksum that follows it. The entries are taken
// one at a time, in order, with PutMany's rules and answers
// (proto/cachestore.proto): an entry may hang from the one before it, a
// refused entry does not stop the ones after it (its bytes are read and
// dropped), and the connection holds one reservation at a time.
//
//   put request  u32 magic 0x31504248 ("HBP1")
//                u32 entry_count          1 .. kBulkMaxPutEntries
//                u32 headers_bytes        the headers below together,
//                                         <= kBulkMaxPutHeadersBytes
//                u32 reserved             0
//                entry_count x (u64 size, u32 header_bytes)
//                headers_bytes bytes      entry_count serialized
//                                         v1::PutHeader, in order (each
//                                         size_bytes equal to its entry's)
//                then per entry, in order: its `size` bytes, then their
//                                         u64 XXH3-64
//
//   put response u32 magic 0x31504248
//                u32 code                 OK, or why the request was refused
//                                         (INVALID_ARGUMENT; the connection
//                                         then ends)
//                u32 answer_count         entry_count when OK, else 0
//                u32 message_bytes        <= kBulkMaxMessageBytes
//                message_bytes bytes      the status message
//                answer_count x (u32 bytes, a serialized v1::PutManyResponse
//                               of at most kMaxPutAnswerBytes)
//
// The response comes after the last entry's checksum. A request whose
// entries together are larger than `max_request_bytes` (the server's: its
// budgets) is refused before any byte of them is read.
inline constexpr uint32_t kBulkPutMagic = 0x31504248;  // "HBP1"
inline constexpr uint32_t kBulkMaxPutEntries = 4096;
inline constexpr uint32_t kBulkMaxPutHeadersBytes = 16u << 20;
inline constexpr size_t kBulkPutEntryBytes = 12;

struct BulkPutEntry {
  uint64_t size = 0;
  std::string header;  // a serialized v1::PutHeader
};

struct BulkPutRequest {
  std::vector<BulkPutEntry> entries;  // their bytes follow the request on the connection
};

// The answer (put_answers.h).
using BulkPutResponse = PutAnswers;

// What one request on the port is: a read (HSB1) or a put (HBP1).
struct BulkMessage {
  std::optional<BulkRequest> read;
  std::optional<BulkPutRequest> put;
};

// Reads one request, a read or a put (its entries' bytes stay on the
// connection), by `deadline`. UNAVAILABLE: the peer closed the connection or
// the I/O failed; DEADLINE_EXCEEDED; INVALID_ARGUMENT: a malformed request
// (bad magic, no keys or more than kBulkMaxKeys; a put of no entries or too
// many, headers longer than the limit or other than the table says, entries
// together over `max_put_bytes`).
// `*magic` (when given) is set to the request's magic once it has arrived,
// so that a refusal can answer in the request's format.
absl::StatusOr<BulkMessage> ReadBulkMessage(common::Socket& socket, absl::Time deadline, uint64_t max_put_bytes,
                                            uint32_t* magic = nullptr);

// The head of a put request (its entries' bytes and checksums follow it).
std::string EncodeBulkPutRequest(const BulkPutRequest& request);

std::string EncodeBulkPutResponse(const BulkPutResponse& response);
// INVALID_ARGUMENT: a malformed response (bad magic, an unknown code, an
// answer count other than `entry_count` when OK, a long answer or message);
// the socket's errors otherwise.
absl::StatusOr<BulkPutResponse> ReadBulkPutResponse(common::Socket& socket, size_t entry_count, absl::Time deadline);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_WIRE_BULK_PROTOCOL_H_
