#include "cachestore/shm_read_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hybridserve::cachestore {
namespace {

// Entries start at multiples of this in the memfd (cache lines).
constexpr uint64_t kEntryAlignment = 64;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// The socket's directory must keep other users from replacing the socket.
absl::Status CheckSocketDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return Errno("cannot stat the shm socket's directory", dir);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shm socket's directory ", dir, " is writable by other users and not sticky"));
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shm socket's directory ", dir, " belongs to uid ", st.st_uid, ", not this process or root"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> CreateSealedMemfd(uint64_t size, const std::function<absl::Status(int fd)>& fill) {
  const int fd = memfd_create("hybridserve-cache-read", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  auto fail = [fd](absl::Status s) -> absl::StatusOr<int> {
    close(fd);
    return s;
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(absl::ResourceExhaustedError(absl::StrCat("memfd of ", size, " bytes: ", std::strerror(errno))));
  }
  if (absl::Status s = fill(fd); !s.ok()) return fail(s);
  // No writable mapping exists (fill writes with pwrite), so the write seal
  // takes at once.
  if (fcntl(fd, F_ADD_SEALS, ShmRequiredSeals()) != 0) {
    return fail(absl::InternalError(absl::StrCat("sealing the memfd: ", std::strerror(errno))));
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<ShmReadServer>> ShmReadServer::Start(const ShmReadServerOptions& options,
                                                                    CacheStore& store,
                                                                    std::function<void(const ShmReadEvent&)> observe) {
  sockaddr_un addr{};
  if (options.socket_path.empty() || options.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm socket path must have 1 to ", sizeof(addr.sun_path) - 1, " bytes: ", options.socket_path));
  }
  if (options.max_connections < 1) return absl::InvalidArgumentError("shm max_connections must be >= 1");
  if (options.io_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("shm io_timeout must be > 0");
  if (absl::Status s = CheckSocketDirectory(options.socket_path); !s.ok()) return s;
  const std::string& path = options.socket_path;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket; not replacing it"));
    }
    unlink(path.c_str());
  }
  auto server = std::unique_ptr<ShmReadServer>(new ShmReadServer(options, store, std::move(observe)));
  // Non-blocking: every serving thread wakes for a connection and all but
  // one find nothing to accept.
  server->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (server->listen_fd_ < 0) return Errno("socket for", path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("bind", path);
  // 0600 before listen: nobody can connect before the mode is set.
  if (chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0) return Errno("chmod", path);
  if (listen(server->listen_fd_, 64) != 0) return Errno("listen", path);
  server->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->stop_fd_ < 0) return Errno("eventfd for", path);
  for (int i = 0; i < options.max_connections; ++i) {
    server->threads_.emplace_back([s = server.get()] { s->Serve(); });
  }
  return server;
}

ShmReadServer::ShmReadServer(const ShmReadServerOptions& options, CacheStore& store,
                             std::function<void(const ShmReadEvent&)> observe)
    : options_(options),
      allowed_uids_(options.allowed_uids.empty() ? std::vector<uid_t>{geteuid()} : options.allowed_uids),
      store_(store),
      observe_(std::move(observe)) {}

ShmReadServer::~ShmReadServer() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void ShmReadServer::Stop() {
  if (stopped_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (listen_fd_ >= 0) unlink(options_.socket_path.c_str());
}

bool ShmReadServer::WaitReadable(int fd) {
  pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.io_timeout));
  while (true) {
    const int n = poll(fds, 2, fd == listen_fd_ ? -1 : timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (fds[1].revents != 0) return false;
    return true;
  }
}

void ShmReadServer::Serve() {
  while (WaitReadable(listen_fd_)) {
    // Blocking I/O with timeouts (accept4 does not pass O_NONBLOCK on).
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // another thread took it, or the peer left
    SetShmSocketTimeout(fd, options_.io_timeout);
    ucred cred{};
    socklen_t len = sizeof(cred);
    absl::Status peer = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0
                            ? CheckShmPeer(cred.uid, cred.pid, allowed_uids_)
                            : absl::PermissionDeniedError("shm peer without credentials");
    if (peer.ok()) {
      ServeConnection(fd);
    } else {
      LOG(WARNING) << "shm socket " << options_.socket_path << ": " << peer;
      if (observe_) observe_(ShmReadEvent{peer.code(), 0, /*refused_peer=*/true});
      // The request is read first: a socket closed with unread bytes resets
      // the peer's, which would lose the refusal.
      (void)ReadShmRequest(fd);
      ShmResponse refusal;
      refusal.status = peer;
      (void)WriteShmResponse(fd, refusal, -1);
    }
    close(fd);
  }
}

void ShmReadServer::ServeConnection(int fd) {
  while (WaitReadable(fd)) {
    absl::StatusOr<ShmRequest> request = ReadShmRequest(fd);
    if (!request.ok()) {
      if (request.status().code() == absl::StatusCode::kInvalidArgument) {
        ShmResponse refusal;
        refusal.status = request.status();
        (void)WriteShmResponse(fd, refusal, -1);
        if (observe_) observe_(ShmReadEvent{refusal.status.code(), 0, false});
      }
      return;  // closed, timed out or malformed: the connection ends
    }
    int memfd = -1;
    ShmResponse response = Read(*request, &memfd);
    const absl::Status sent = WriteShmResponse(fd, response, memfd);
    if (memfd >= 0) close(memfd);  // the reader's copy is all that is left
    if (observe_) {
      int64_t bytes = 0;
      for (const ShmEntrySpan& e : response.entries) bytes += static_cast<int64_t>(e.size);
      observe_(ShmReadEvent{sent.ok() ? response.status.code() : absl::StatusCode::kUnavailable,
                            sent.ok() && response.status.ok() ? bytes : 0, false});
    }
    if (!sent.ok()) return;
  }
}

ShmResponse ShmReadServer::Read(const ShmRequest& request, int* memfd) {
  *memfd = -1;
  ShmResponse response;
  // The handles keep the entries' buffers alive while they are copied.
  std::vector<ReadHandle> handles;
  handles.reserve(request.keys.size());
  uint64_t total = 0;
  for (size_t i = 0; i < request.keys.size(); ++i) {
    absl::StatusOr<ReadHandle> h = store_.OpenVerified(request.lease_id, request.keys[i]);
    if (!h.ok()) {
      response.status = absl::Status(h.status().code(), absl::StrCat("keys[", i, "]: ", h.status().message()));
      return response;
    }
    ShmEntrySpan span;
    span.offset = total;
    span.size = h->blob->size;
    span.checksum = h->info.checksum;
    total += (span.size + kEntryAlignment - 1) / kEntryAlignment * kEntryAlignment;
    response.entries.push_back(span);
    handles.push_back(*std::move(h));
  }
  response.memfd_bytes = total;
  if (total == 0) return response;  // entries of no bytes: nothing to map
  absl::StatusOr<int> fd = CreateSealedMemfd(total, [&](int f) -> absl::Status {
    for (size_t i = 0; i < handles.size(); ++i) {
      const uint8_t* src = handles[i].blob->data.get();
      uint64_t done = 0;
      const uint64_t size = response.entries[i].size;
      while (done < size) {
        const ssize_t n = pwrite(f, src + done, size - done, static_cast<off_t>(response.entries[i].offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return absl::ResourceExhaustedError(absl::StrCat("writing the memfd: ", std::strerror(errno)));
        done += static_cast<uint64_t>(n);
      }
    }
    return absl::OkStatus();
  });
  if (!fd.ok()) {
    response.status = fd.status();
    response.entries.clear();
    return response;
  }
  *memfd = *fd;
  return response;
}

}  // namespace hybridserve::cachestore
