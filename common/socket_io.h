#ifndef HYBRIDSERVE_COMMON_SOCKET_IO_H_
#define HYBRIDSERVE_COMMON_SOCKET_IO_H_

// Blocking TCP socket helpers with deadlines (non-blocking descriptors; a
// read or write polls only when it would block), for the TCP data plane and
// the cachestore's bulk reads. A file descriptor is owned by a Socket (closed
// on destruction). Thread-compatible: one thread per Socket, except
// Shutdown, which any thread may call to wake a blocked reader.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace hybridserve::common {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Reads exactly `size` bytes. UNAVAILABLE when the peer closes or resets
  // the connection; DEADLINE_EXCEEDED at `deadline`.
  absl::Status ReadFull(char* data, size_t size, absl::Time deadline);
  // Writes all of `data`; the same errors.
  absl::Status WriteFull(absl::string_view data, absl::Time deadline);
  // Writes `parts` back to back in as few system calls as the kernel allows
  // (sendmsg with an iovec, up to IOV_MAX parts a call): a frame header and
  // its payload, or the payload's pieces, leave together. The same errors.
  absl::Status WriteAll(absl::Span<const absl::string_view> parts, absl::Time deadline);
  absl::Status WriteAll(std::initializer_list<absl::string_view> parts, absl::Time deadline) {
    return WriteAll(absl::MakeConstSpan(parts.begin(), parts.size()), deadline);
  }
  // Wakes any blocked read or write (both directions shut down).
  void Shutdown();
  // The connected peer's numeric address, "ip:port" ("[ip]:port" for IPv6),
  // for logs; "an unknown peer" when the system cannot say.
  std::string PeerAddress() const;

 private:
  int fd_ = -1;
};

// A connection to "host:port" (IPv4 or IPv6, numeric or a name), with
// TCP_NODELAY. UNAVAILABLE when it cannot be made by `deadline`;
// INVALID_ARGUMENT for a malformed endpoint.
absl::StatusOr<Socket> Connect(absl::string_view endpoint, absl::Time deadline);

// A listening socket on "host:port" (port 0: any free port), and the port it got.
absl::StatusOr<Socket> Listen(absl::string_view address, int* port);

// Splits "host:port" (IPv6 hosts in brackets); INVALID_ARGUMENT otherwise.
absl::Status SplitHostPort(absl::string_view endpoint, std::string* host, std::string* port);

// The numeric addresses `host` resolves to now (getaddrinfo; an IP literal
// resolves to itself), each once, as gRPC targets with `port`
// ("ipv4:10.0.0.7:50051", "ipv6:[fd00::7]:50051"); empty when it does not
// resolve. Blocks on the resolver. Re-resolving a headless Service with it
// finds its pods as they come and go (prefill pools, cachestore shards).
std::vector<std::string> ResolveHost(const std::string& host, const std::string& port);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_SOCKET_IO_H_
