#ifndef HYBRIDSERVE_CACHESTORE_WIRE_SHM_PROTOCOL_H_
#define HYBRIDSERVE_CACHESTORE_WIRE_SHM_PROTOCOL_H_

// The shared-memory read path's wire format, version 2 (docs/ARCHITECTURE.md
// section 4, "Reads by shared memory"): a worker on the cachestore's host
// reads the entries of a lease it holds through a Unix stream socket; the
// bytes stay where the cachestore keeps them (slots of memfd slabs,
// shm_slab_allocator.h), and the answer carries read-only descriptors of the
// slabs and where each entry lies in them, never the bytes.
//
// One connection carries requests one after another; each request gets one
// response before the next is read. All integers little-endian.
//
//   request   u32 magic 0x324D5348 ("HSM2")
//             u32 key_count            1 .. kShmMaxKeys
//             u64 lease_id             from a leasing gRPC Lookup
//             key_count x 16 bytes     entry keys (Hash128::ToBytes)
//
//   response  u32 magic 0x324D5348
//             u32 code                 absl::StatusCode: 0 OK, else the
//                                      read's status (NOT_FOUND,
//                                      INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
//                                      PERMISSION_DENIED)
//             u32 entry_count          key_count when OK, 0 otherwise
//             u32 message_bytes        <= kShmMaxMessageBytes
//             u32 fd_count             descriptors attached, <= kShmMaxFds;
//                                      0 unless OK
//             u32 reserved             0
//             message_bytes bytes      the status message (empty when OK)
//             entry_count x (u32 fd_index, u64 offset, u64 size, u64 checksum)
//                                      entry i of the request: `size` bytes
//                                      at `offset` in descriptor fd_index,
//                                      whose XXH3-64 must be `checksum`
//
// The fd_count descriptors travel as SCM_RIGHTS ancillary data with the
// response's first byte (one message: kShmMaxFds stays under the kernel's
// SCM_MAX_FD of 253), each slab once however many of its entries the request
// names. Every request's entries come from at most key_count slabs, hence the
// cap on keys; ShmReader splits a larger read into several requests on one
// connection. The descriptors are read-only (O_RDONLY) views of whole slabs,
// which hold other entries too: the bytes of an entry are those at its offset
// only while the reader's lease holds it (a slot freed by eviction or lease
// expiry is reused). The reader checks each descriptor (a regular file opened
// read-only; anything else is a bad descriptor) and that every entry lies
// inside it, and verifies every entry's checksum on the bytes it copied out.
// A version-1 request ("HSM1") gets INVALID_ARGUMENT.

#include <sys/types.h>

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
#include "common/hash.h"
#include "common/socket_io.h"

namespace hybridserve::cachestore {

inline constexpr uint32_t kShmMagic = 0x324D5348;    // "HSM2"
inline constexpr uint32_t kShmMagicV1 = 0x314D5348;  // "HSM1": refused
// Descriptors one response may carry (SCM_MAX_FD is 253), and so keys one
// request may name.
inline constexpr uint32_t kShmMaxFds = 250;
inline constexpr uint32_t kShmMaxKeys = kShmMaxFds;
inline constexpr uint32_t kShmMaxMessageBytes = 4096;
inline constexpr size_t kShmRequestHeaderBytes = 16;
inline constexpr size_t kShmResponseHeaderBytes = 24;
inline constexpr size_t kShmEntryBytes = 28;

struct ShmRequest {
  uint64_t lease_id = 0;
  std::vector<Hash128> keys;
};

struct ShmEntrySpan {
  uint32_t fd_index = 0;  // into the response's descriptors
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

struct ShmResponse {
  absl::Status status;                // OK: entries and the descriptors describe the read
  std::vector<ShmEntrySpan> entries;  // as many as the request's keys when OK
};

std::string EncodeShmRequest(const ShmRequest& request);

// Writes `response` to `fd`, with `fds` (at most kShmMaxFds; only when the
// status is OK) as SCM_RIGHTS on its first byte. UNAVAILABLE on an I/O error
// (the peer went away); INVALID_ARGUMENT for too many descriptors.
absl::Status WriteShmResponse(int fd, const ShmResponse& response, absl::Span<const int> fds = {});

// Reads one response from `fd`. The received descriptors (close-on-exec) are
// stored in *fds in the response's order; the caller owns them. UNAVAILABLE
// on I/O errors and timeouts, INVALID_ARGUMENT on a malformed response (an
// entry's fd_index outside the descriptors, or as many descriptors as the
// header says not received); on any error no descriptor is left open.
absl::StatusOr<ShmResponse> ReadShmResponse(int fd, std::vector<int>* fds);

// ---- Puts ("HSP1") ----
//
// A worker on the cachestore's host puts entries through the same socket
// (a connection may carry reads and puts, one after another): it writes the
// entries' bytes into a memfd of its own and sends the descriptor; the
// cachestore copies each entry once, from the descriptor into the entry's
// reservation, hashing what it stored, and commits it against the checksum
// the request names. The entries are taken one at a time, in order, with
// PutMany's rules and answers (proto/cachestore.proto): an entry may hang
// from the one before it, and a refused entry does not stop the ones after.
//
//   put request  u32 magic 0x31505348 ("HSP1")
//                u32 entry_count          1 .. kShmMaxPutEntries
//                u32 headers_bytes        the headers below together,
//                                         <= kShmMaxPutHeadersBytes
//                u32 reserved             0
//                entry_count x (u64 offset, u64 size, u64 checksum,
//                               u32 header_bytes)
//                                         entry i: `size` bytes at `offset`
//                                         in the descriptor, whose XXH3-64
//                                         must be `checksum`
//                headers_bytes bytes      entry_count serialized
//                                         v1::PutHeader, in order (each
//                                         size_bytes equal to its entry's size)
//
//   put response u32 magic 0x31505348
//                u32 code                 OK, or why no entry was taken
//                                         (INVALID_ARGUMENT, PERMISSION_DENIED)
//                u32 answer_count         entry_count when OK, else 0
//                u32 message_bytes        <= kShmMaxMessageBytes
//                message_bytes bytes      the status message
//                answer_count x (u32 bytes, a serialized v1::PutManyResponse
//                               of at most kMaxPutAnswerBytes)
//
// Exactly one descriptor travels as SCM_RIGHTS with the request's first
// byte: a shared-memory file (memfd) the cachestore can read. No descriptor,
// several, or any other kind of file (a pipe, a socket, a file on a disk or a
// FUSE mount, whose reads could block a serving thread) is INVALID_ARGUMENT.
// The cachestore reads the descriptor only while it serves the request and
// closes it before it answers. What the writer changes meanwhile fails the
// entry's checksum (DATA_LOSS): the bytes hashed are the bytes stored.
inline constexpr uint32_t kShmPutMagic = 0x31505348;  // "HSP1"
inline constexpr uint32_t kShmMaxPutEntries = 4096;   // GetMany's and PutMany's bound
inline constexpr uint32_t kShmMaxPutHeadersBytes = 16u << 20;
inline constexpr size_t kShmPutEntryBytes = 28;

struct ShmPutEntry {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  std::string header;  // a serialized v1::PutHeader
};

struct ShmPutRequest {
  std::vector<ShmPutEntry> entries;
};

// The answer (put_answers.h).
using ShmPutResponse = PutAnswers;

// What one request on the socket is: a read (HSM2) or a put (HSP1) with the
// put's descriptor (owned by the caller; -1 for a read).
struct ShmMessage {
  std::optional<ShmRequest> read;
  std::optional<ShmPutRequest> put;
  int put_fd = -1;
};

// The request's bytes; `fd` travels with the first of them.
std::string EncodeShmPutRequest(const ShmPutRequest& request);

// Reads one request, a read or a put, from `fd`. OUT_OF_RANGE: the peer
// closed the connection before the first byte (a normal end).
// INVALID_ARGUMENT: a malformed request, one of version 1, or a put without
// exactly one descriptor. UNAVAILABLE: an I/O error or a timeout
// (SO_RCVTIMEO) part way. `*magic` (when given) is set to the request's magic
// once it has arrived, so that a refusal can answer in the request's format.
// Descriptors that arrive with a read are closed; on error none is left open.
absl::StatusOr<ShmMessage> ReadShmMessage(int fd, uint32_t* magic = nullptr);

// Writes a put request with `data_fd` attached (UNAVAILABLE on an I/O error).
absl::Status WriteShmPutRequest(int fd, const ShmPutRequest& request, int data_fd);

absl::Status WriteShmPutResponse(int fd, const ShmPutResponse& response);

// Reads a put's response. UNAVAILABLE on I/O errors and timeouts,
// INVALID_ARGUMENT on a malformed one (a bad magic, too long an answer or
// message); descriptors that arrive with it are closed.
absl::StatusOr<ShmPutResponse> ReadShmPutResponse(int fd);

// A connection to the shm socket at `path`, with `timeout` on each read and
// write. INVALID_ARGUMENT for a path a Unix socket cannot have; UNAVAILABLE
// when the connection cannot be made.
absl::StatusOr<common::Socket> ConnectShmSocket(const std::string& path, absl::Duration timeout);

// Sets SO_RCVTIMEO and SO_SNDTIMEO on `fd`.
void SetShmSocketTimeout(int fd, absl::Duration timeout);

// The trust check of a connecting process: its credentials (SO_PEERCRED) name
// an allowed uid. PERMISSION_DENIED naming the uid and pid otherwise.
absl::Status CheckShmPeer(uid_t uid, pid_t pid, absl::Span<const uid_t> allowed_uids);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_WIRE_SHM_PROTOCOL_H_
