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

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hybridserve::cachestore {
namespace {

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
  if (store.options().blob_storage != BlobStorage::kSharedMemory) {
    return absl::FailedPreconditionError(
        "the shm read server needs the store's entries in shared memory (CacheIndexOptions::blob_storage)");
  }
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
      (void)WriteShmResponse(fd, refusal);
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
        (void)WriteShmResponse(fd, refusal);
        if (observe_) observe_(ShmReadEvent{refusal.status.code(), 0, false});
      }
      return;  // closed, timed out or malformed: the connection ends
    }
    std::vector<int> fds;
    std::vector<ReadHandle> entries;
    ShmResponse response = Read(*request, &fds, &entries);
    const absl::Status sent = WriteShmResponse(fd, response, fds);
    // The descriptors were the slabs' own: they are in the reader's socket
    // now, and the entries may go.
    entries.clear();
    if (observe_) {
      int64_t bytes = 0;
      for (const ShmEntrySpan& e : response.entries) bytes += static_cast<int64_t>(e.size);
      observe_(ShmReadEvent{sent.ok() ? response.status.code() : absl::StatusCode::kUnavailable,
                            sent.ok() && response.status.ok() ? bytes : 0, false});
    }
    if (!sent.ok()) return;
  }
}

ShmResponse ShmReadServer::Read(const ShmRequest& request, std::vector<int>* fds, std::vector<ReadHandle>* entries) {
  ShmResponse response;
  entries->reserve(request.keys.size());
  response.entries.reserve(request.keys.size());
  // Each slab once, at the index of its first entry's descriptor.
  absl::flat_hash_map<int, uint32_t> fd_index;
  for (size_t i = 0; i < request.keys.size(); ++i) {
    absl::StatusOr<ReadHandle> h = store_.Open(request.lease_id, request.keys[i]);
    if (!h.ok()) {
      response.status = absl::Status(h.status().code(), absl::StrCat("keys[", i, "]: ", h.status().message()));
      response.entries.clear();
      fds->clear();
      return response;
    }
    const Blob& blob = *h->blob;
    DCHECK_GE(blob.shm_fd, 0) << "a store in shared memory made a heap blob";
    auto [it, added] = fd_index.try_emplace(blob.shm_fd, static_cast<uint32_t>(fds->size()));
    if (added) fds->push_back(blob.shm_fd);
    response.entries.push_back(ShmEntrySpan{it->second, blob.shm_offset, blob.size, h->info.checksum});
    entries->push_back(*std::move(h));
  }
  return response;
}

}  // namespace hybridserve::cachestore
