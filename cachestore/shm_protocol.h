#ifndef HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_
#define HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_

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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cachestore/keys.h"
#include "common/hash.h"

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

// Reads one request from `fd`. OUT_OF_RANGE: the peer closed the connection
// before the first byte (a normal end). INVALID_ARGUMENT: a malformed request,
// or one of version 1. UNAVAILABLE: an I/O error or a timeout (SO_RCVTIMEO)
// part way.
absl::StatusOr<ShmRequest> ReadShmRequest(int fd);

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

// Sets SO_RCVTIMEO and SO_SNDTIMEO on `fd`.
void SetShmSocketTimeout(int fd, absl::Duration timeout);

// The trust check of a connecting process: its credentials (SO_PEERCRED) name
// an allowed uid. PERMISSION_DENIED naming the uid and pid otherwise.
absl::Status CheckShmPeer(uid_t uid, pid_t pid, absl::Span<const uid_t> allowed_uids);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_
