#ifndef HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_
#define HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_

// The shared-memory read path's wire format (docs/ARCHITECTURE.md section 4,
// "Reads by shared memory"): a worker on the cachestore's host reads the
// entries of a lease it holds through a Unix stream socket; the bytes come as
// one sealed memfd, never through the socket.
//
// One connection carries requests one after another; each request gets one
// response before the next is read. All integers little-endian.
//
//   request   u32 magic 0x314D5348 ("HSM1")
//             u32 key_count            1 .. kShmMaxKeys
//             u64 lease_id             from a leasing gRPC Lookup
//             key_count x 16 bytes     entry keys (Hash128::ToBytes)
//
//   response  u32 magic 0x314D5348
//             u32 code                 absl::StatusCode: 0 OK, else the
//                                      read's status (NOT_FOUND, DATA_LOSS,
//                                      INVALID_ARGUMENT, RESOURCE_EXHAUSTED)
//             u32 entry_count          key_count when OK, 0 otherwise
//             u32 message_bytes        <= kShmMaxMessageBytes
//             u64 memfd_bytes          size of the attached memfd; 0: none
//             message_bytes bytes      the status message (empty when OK)
//             entry_count x (u64 offset, u64 size, u64 checksum)
//                                      entry i of the request: `size` bytes
//                                      at `offset` in the memfd, whose
//                                      XXH3-64 must be `checksum`
//
// With code OK and memfd_bytes > 0, exactly one file descriptor travels as
// SCM_RIGHTS ancillary data with the response's first byte: a memfd of
// memfd_bytes bytes, sealed with F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL before it was sent, holding copies of the entries' committed
// bytes. The reader maps it read-only (MAP_PRIVATE: a write-sealed memfd
// refuses shared mappings on kernels before 6.7), checks the seals and size
// (bad_fd otherwise), and verifies every entry's checksum before use.

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

inline constexpr uint32_t kShmMagic = 0x314D5348;  // "HSM1"
// The same bound as GetMany's (proto/cachestore.proto).
inline constexpr uint32_t kShmMaxKeys = 4096;
inline constexpr uint32_t kShmMaxMessageBytes = 4096;
inline constexpr size_t kShmRequestHeaderBytes = 16;
inline constexpr size_t kShmResponseHeaderBytes = 24;
// The seals every memfd the server sends carries, and the reader requires.
int ShmRequiredSeals();

struct ShmRequest {
  uint64_t lease_id = 0;
  std::vector<Hash128> keys;
};

struct ShmEntrySpan {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

struct ShmResponse {
  absl::Status status;  // OK: entries and the memfd describe the read
  uint64_t memfd_bytes = 0;
  std::vector<ShmEntrySpan> entries;  // as many as the request's keys when OK
};

std::string EncodeShmRequest(const ShmRequest& request);

// Reads one request from `fd`. OUT_OF_RANGE: the peer closed the connection
// before the first byte (a normal end). INVALID_ARGUMENT: a malformed request.
// UNAVAILABLE: an I/O error or a timeout (SO_RCVTIMEO) part way.
absl::StatusOr<ShmRequest> ReadShmRequest(int fd);

// Writes `response` to `fd`, with `memfd` (when >= 0) as SCM_RIGHTS on its
// first byte. UNAVAILABLE on an I/O error (the peer went away).
absl::Status WriteShmResponse(int fd, const ShmResponse& response, int memfd);

// Reads one response from `fd`. The received descriptor (close-on-exec), if
// any, is stored in *memfd (else -1); the caller owns it. UNAVAILABLE on I/O
// errors and timeouts, INVALID_ARGUMENT on a malformed response (a descriptor
// received with it is closed).
absl::StatusOr<ShmResponse> ReadShmResponse(int fd, int* memfd);

// Sets SO_RCVTIMEO and SO_SNDTIMEO on `fd`.
void SetShmSocketTimeout(int fd, absl::Duration timeout);

// The trust check of a connecting process: its credentials (SO_PEERCRED) name
// an allowed uid. PERMISSION_DENIED naming the uid and pid otherwise.
absl::Status CheckShmPeer(uid_t uid, pid_t pid, absl::Span<const uid_t> allowed_uids);

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_SHM_PROTOCOL_H_
