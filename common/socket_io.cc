#include "common/socket_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hybridserve::common {
namespace {

// Milliseconds until `deadline` for poll(), capped so a far deadline still
// wakes periodically; 0 when it has passed.
int PollTimeoutMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // (capped before the +1: an infinite deadline is INT64_MAX milliseconds)
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left), 999) + 1);
}

// Waits until `fd` is ready for `events`; DEADLINE_EXCEEDED at `deadline`.
absl::Status WaitReady(int fd, short events, absl::Time deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, PollTimeoutMs(deadline));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("socket timed out");
  }
}

absl::StatusOr<addrinfo*> Resolve(absl::string_view endpoint, bool passive) {
  std::string host, port;
  if (absl::Status s = SplitHostPort(endpoint, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("cannot resolve ", endpoint, ": ", gai_strerror(rc)));
  return result;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

void Socket::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

std::string Socket::PeerAddress() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (fd_ < 0 || getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown peer";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// The socket is non-blocking: each call tries the read or write first and
// polls only when it would block, so a busy stream costs one system call per
// chunk, not two.
absl::Status Socket::ReadFull(char* data, size_t size, absl::Time deadline) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = recv(fd_, data + done, size - done, 0);
    if (n == 0) return absl::UnavailableError("the peer closed the connection");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("connection: ", std::strerror(errno)));
      }
      if (absl::Status s = WaitReady(fd_, POLLIN, deadline); !s.ok()) return s;
      continue;
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Socket::WriteFull(absl::string_view data, absl::Time deadline) { return WriteAll({data}, deadline); }

absl::Status Socket::WriteAll(absl::Span<const absl::string_view> parts, absl::Time deadline) {
  absl::InlinedVector<iovec, 8> iov;
  for (absl::string_view part : parts) {
    if (!part.empty()) iov.push_back(iovec{const_cast<char*>(part.data()), part.size()});
  }
  const size_t count = iov.size();
  size_t first = 0;  // iov[first..count) is still to be written
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(count - first, IOV_MAX);
    const ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("connection: ", std::strerror(errno)));
      }
      if (absl::Status s = WaitReady(fd_, POLLOUT, deadline); !s.ok()) return s;
      continue;
    }
    size_t left = static_cast<size_t>(n);
    while (first < count && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (first < count) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status SplitHostPort(absl::string_view endpoint, std::string* host, std::string* port) {
  size_t colon;
  if (!endpoint.empty() && endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    if (close == absl::string_view::npos || close + 1 >= endpoint.size() || endpoint[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("endpoint \"", endpoint, "\" is not [host]:port"));
    }
    *host = std::string(endpoint.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = endpoint.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("endpoint \"", endpoint, "\" is not host:port"));
    }
    *host = std::string(endpoint.substr(0, colon));
  }
  *port = std::string(endpoint.substr(colon + 1));
  int value = 0;
  if (!absl::SimpleAtoi(*port, &value) || value < 0 || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint \"", endpoint, "\" has no valid port"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Socket> Connect(absl::string_view endpoint, absl::Time deadline) {
  absl::StatusOr<addrinfo*> addrs = Resolve(endpoint, /*passive=*/false);
  if (!addrs.ok()) return addrs.status();
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", endpoint));
  for (addrinfo* a = *addrs; a != nullptr; a = a->ai_next) {
    Socket s(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    int rc = connect(s.fd(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      absl::Status ready = WaitReady(s.fd(), POLLOUT, deadline);
      if (!ready.ok()) {
        last = absl::UnavailableError(absl::StrCat("connect to ", endpoint, ": ", ready.message()));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last = absl::UnavailableError(absl::StrCat("connect to ", endpoint, ": ", std::strerror(errno)));
      continue;
    }
    const int one = 1;
    setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    freeaddrinfo(*addrs);
    return s;
  }
  freeaddrinfo(*addrs);
  return last;
}

absl::StatusOr<Socket> Listen(absl::string_view address, int* port) {
  absl::StatusOr<addrinfo*> addrs = Resolve(address, /*passive=*/true);
  if (!addrs.ok()) return addrs.status();
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", address));
  for (addrinfo* a = *addrs; a != nullptr; a = a->ai_next) {
    Socket s(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    const int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || listen(s.fd(), 128) != 0) {
      last = absl::UnavailableError(absl::StrCat("listen on ", address, ": ", std::strerror(errno)));
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &len);
    *port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(*addrs);
    return s;
  }
  freeaddrinfo(*addrs);
  return last;
}

std::vector<std::string> ResolveHost(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<std::string> out;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char ip[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string target =
        a->ai_family == AF_INET6 ? absl::StrCat("ipv6:[", ip, "]:", port) : absl::StrCat("ipv4:", ip, ":", port);
    if (std::find(out.begin(), out.end(), target) == out.end()) out.push_back(std::move(target));
  }
  freeaddrinfo(found);
  return out;
}

}  // namespace hybridserve::common
