#include "cachestore/server/shm_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cachestore/server/put_header.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/cachestore.pb.h"

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

// A put's descriptor: a shared-memory file (memfd, tmpfs) opened for
// reading, whose reads cannot block; its size in *size.
absl::Status CheckPutDescriptor(int fd, uint64_t* size) {
  const int flags = fcntl(fd, F_GETFL);
  struct stat st {};
  if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      fcntl(fd, F_GET_SEALS) < 0) {
    return absl::InvalidArgumentError(
        "shm put: the descriptor is not a readable shared-memory file (memfd_create's, or tmpfs)");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return absl::OkStatus();
}

// Copies the session's declared bytes from `fd` at `offset` into its
// reservation, a piece at a time (each piece is progress against the put's
// put_timeout). INVALID_ARGUMENT when the descriptor ends early or fails.
absl::Status CopyInto(PutSession& session, int fd, uint64_t offset) {
  constexpr int64_t kPiece = int64_t{4} << 20;
  for (int64_t at = 0; at < session.size_bytes();) {
    const int64_t piece = std::min(kPiece, session.size_bytes() - at);
    RETURN_IF_ERROR(session.WriteFromFile(at, piece, fd, offset + static_cast<uint64_t>(at)));
    at += piece;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmServer>> ShmServer::Start(const ShmServerOptions& options, CacheStore& store,
                                                            std::function<void(const ShmReadEvent&)> observe,
                                                            std::function<void(const ShmPutEvent&)> observe_put) {
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
  auto server = std::unique_ptr<ShmServer>(new ShmServer(options, store, std::move(observe), std::move(observe_put)));
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

ShmServer::ShmServer(const ShmServerOptions& options, CacheStore& store,
                     std::function<void(const ShmReadEvent&)> observe,
                     std::function<void(const ShmPutEvent&)> observe_put)
    : options_(options),
      allowed_uids_(options.allowed_uids.empty() ? std::vector<uid_t>{geteuid()} : options.allowed_uids),
      store_(store),
      observe_(std::move(observe)),
      observe_put_(std::move(observe_put)) {}

ShmServer::~ShmServer() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void ShmServer::Stop() {
  if (stopped_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  if (listen_fd_ >= 0) unlink(options_.socket_path.c_str());
}

bool ShmServer::WaitReadable(int fd) {
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

void ShmServer::Serve() {
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
      uint32_t magic = 0;
      absl::StatusOr<ShmMessage> unread = ReadShmMessage(fd, &magic);
      if (unread.ok() && unread->put_fd >= 0) close(unread->put_fd);
      Refuse(fd, magic, peer);
    }
    close(fd);
  }
}

void ShmServer::ServeConnection(int fd) {
  while (WaitReadable(fd)) {
    uint32_t magic = 0;
    absl::StatusOr<ShmMessage> message = ReadShmMessage(fd, &magic);
    if (!message.ok()) {
      if (message.status().code() == absl::StatusCode::kInvalidArgument) {
        Refuse(fd, magic, message.status());
        if (observe_) observe_(ShmReadEvent{message.status().code(), 0, false});
      }
      return;  // closed, timed out or malformed: the connection ends
    }
    if (message->put.has_value()) {
      ShmPutResponse response = Put(*message->put, message->put_fd);
      close(message->put_fd);
      if (!WriteShmPutResponse(fd, response).ok()) return;
      continue;
    }
    std::vector<int> fds;
    std::vector<ReadHandle> entries;
    ShmResponse response = Read(*message->read, &fds, &entries);
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

void ShmServer::Refuse(int fd, uint32_t magic, const absl::Status& why) {
  if (magic == kShmPutMagic) {
    ShmPutResponse refusal;
    refusal.status = why;
    (void)WriteShmPutResponse(fd, refusal);
  } else {
    ShmResponse refusal;
    refusal.status = why;
    (void)WriteShmResponse(fd, refusal);
  }
}

ShmPutResponse ShmServer::Put(const ShmPutRequest& request, int data_fd) {
  ShmPutResponse response;
  uint64_t data_size = 0;
  response.status = CheckPutDescriptor(data_fd, &data_size);
  if (!response.status.ok()) return response;
  response.answers.reserve(request.entries.size());
  for (size_t i = 0; i < request.entries.size(); ++i) {
    const absl::Time start = absl::Now();
    int64_t committed = 0;
    absl::StatusCode code = absl::StatusCode::kOk;
    response.answers.push_back(
        PutEntry(request.entries[i], static_cast<uint32_t>(i), data_fd, data_size, &committed, &code));
    if (observe_put_) observe_put_(ShmPutEvent{code, committed, absl::ToDoubleSeconds(absl::Now() - start)});
  }
  return response;
}

std::string ShmServer::PutEntry(const ShmPutEntry& entry, uint32_t index, int data_fd, uint64_t data_size,
                                int64_t* committed, absl::StatusCode* code) {
  std::unique_ptr<PutSession> session;
  const absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(session, BeginDirectPut(store_, entry.header, entry.size));
    if (entry.offset > data_size || entry.size > data_size - entry.offset) {
      return absl::InvalidArgumentError(absl::StrCat("the entry at ", entry.offset, "+", entry.size,
                                                     " lies outside its descriptor of ", data_size, " bytes"));
    }
    if (session->already_present()) return absl::OkStatus();
    RETURN_IF_ERROR(CopyInto(*session, data_fd, entry.offset));
    RETURN_IF_ERROR(session->Commit(entry.checksum));
    *committed = session->size_bytes();
    return absl::OkStatus();
  }();
  *code = status.code();
  return DirectPutAnswer(index, status, session.get(), kShmMaxMessageBytes);
}

ShmResponse ShmServer::Read(const ShmRequest& request, std::vector<int>* fds, std::vector<ReadHandle>* entries) {
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
