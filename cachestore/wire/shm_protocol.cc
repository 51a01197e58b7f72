#include "cachestore/wire/shm_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachestore/wire/wire_ints.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {
namespace {

using wire::GetU32;
using wire::GetU64;
using wire::PutU32;
using wire::PutU64;

absl::Status IoError(absl::string_view what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) return absl::UnavailableError(absl::StrCat(what, ": timed out"));
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Reads exactly `size` bytes. Descriptors arriving as SCM_RIGHTS are appended
// to *fds when fds is not null, and closed otherwise. `*eof_at_start` (when
// given) is set if the peer closed before the first byte.
absl::Status ReadExactly(int fd, char* buf, size_t size, std::vector<int>* fds, bool* eof_at_start) {
  size_t got = 0;
  while (got < size) {
    iovec iov{buf + got, size - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kShmMaxFds)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("shm socket read", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds != nullptr) {
          fds->push_back(received);
        } else {
          close(received);
        }
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm socket: more than ", kShmMaxFds, " descriptors arrived (truncated)"));
    }
    if (n == 0) {
      if (got == 0 && eof_at_start != nullptr) *eof_at_start = true;
      return absl::UnavailableError(absl::StrCat("shm socket closed after ", got, " of ", size, " bytes"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const std::string& bytes, absl::Span<const int> attach) {
  size_t sent = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kShmMaxFds)];
  while (sent < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data()) + sent, bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && !attach.empty()) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * attach.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * attach.size());
      std::memcpy(CMSG_DATA(c), attach.data(), sizeof(int) * attach.size());
    }
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("shm socket write", errno);
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void CloseAll(std::vector<int>& fds) {
  for (int f : fds) close(f);
  fds.clear();
}

}  // namespace

std::string EncodeShmRequest(const ShmRequest& request) {
  std::string out;
  out.reserve(kShmRequestHeaderBytes + 16 * request.keys.size());
  PutU32(&out, kShmMagic);
  PutU32(&out, static_cast<uint32_t>(request.keys.size()));
  PutU64(&out, request.lease_id);
  for (const Hash128& k : request.keys) out += k.ToBytes();
  return out;
}

namespace {

// The rest of a read request after its header.
absl::StatusOr<ShmRequest> ReadRestOfRead(int fd, const char* header) {
  const uint32_t count = GetU32(header + 4);
  if (count == 0 || count > kShmMaxKeys) {
    return absl::InvalidArgumentError(absl::StrCat("shm request: ", count, " keys, must be in [1, ", kShmMaxKeys, "]"));
  }
  ShmRequest request;
  request.lease_id = GetU64(header + 8);
  std::string keys(16 * static_cast<size_t>(count), '\0');
  // A read carries no descriptors: any that arrive are closed.
  if (absl::Status r = ReadExactly(fd, keys.data(), keys.size(), nullptr, nullptr); !r.ok()) return r;
  request.keys.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    Hash128::FromBytes(absl::string_view(keys.data() + 16 * i, 16), &request.keys[i]);
  }
  return request;
}

// The rest of a put request after its header; descriptors arriving with it
// join *fds.
absl::StatusOr<ShmPutRequest> ReadRestOfPut(int fd, const char* header, std::vector<int>* fds) {
  const uint32_t count = GetU32(header + 4);
  const uint32_t headers_bytes = GetU32(header + 8);
  if (count == 0 || count > kShmMaxPutEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm put: ", count, " entries, must be in [1, ", kShmMaxPutEntries, "]"));
  }
  if (headers_bytes > kShmMaxPutHeadersBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm put: ", headers_bytes, " bytes of headers > ", kShmMaxPutHeadersBytes));
  }
  std::string table(kShmPutEntryBytes * count, '\0');
  RETURN_IF_ERROR(ReadExactly(fd, table.data(), table.size(), fds, nullptr));
  ShmPutRequest request;
  request.entries.resize(count);
  uint64_t declared = 0;
  std::vector<uint32_t> lengths(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = table.data() + kShmPutEntryBytes * i;
    ShmPutEntry& e = request.entries[i];
    e.offset = GetU64(p);
    e.size = GetU64(p + 8);
    e.checksum = GetU64(p + 16);
    lengths[i] = GetU32(p + 24);
    declared += lengths[i];
  }
  if (declared != headers_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm put: the entries' headers add up to ", declared, " bytes, the request says ", headers_bytes));
  }
  std::string headers(headers_bytes, '\0');
  RETURN_IF_ERROR(ReadExactly(fd, headers.data(), headers.size(), fds, nullptr));
  size_t at = 0;
  for (uint32_t i = 0; i < count; ++i) {
    request.entries[i].header = headers.substr(at, lengths[i]);
    at += lengths[i];
  }
  return request;
}

}  // namespace

absl::StatusOr<ShmMessage> ReadShmMessage(int fd, uint32_t* magic_out) {
  char header[kShmRequestHeaderBytes];
  std::vector<int> fds;
  auto fail = [&fds](absl::Status status) -> absl::StatusOr<ShmMessage> {
    CloseAll(fds);
    return status;
  };
  bool eof = false;
  absl::Status s = ReadExactly(fd, header, sizeof(header), &fds, &eof);
  if (eof) return fail(absl::OutOfRangeError("the peer closed the connection"));
  if (!s.ok()) return fail(s);
  const uint32_t magic = GetU32(header);
  if (magic_out != nullptr) *magic_out = magic;
  ShmMessage message;
  if (magic == kShmPutMagic) {
    absl::StatusOr<ShmPutRequest> put = ReadRestOfPut(fd, header, &fds);
    if (!put.ok()) return fail(put.status());
    if (fds.size() != 1) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("shm put: ", fds.size(), " descriptors arrived; a put carries exactly one")));
    }
    message.put = *std::move(put);
    message.put_fd = fds[0];
    return message;
  }
  CloseAll(fds);
  if (magic == kShmMagicV1) {
    return absl::InvalidArgumentError("shm request of version 1 (HSM1): this cachestore speaks version 2 (HSM2)");
  }
  if (magic != kShmMagic) return absl::InvalidArgumentError("shm request: bad magic");
  absl::StatusOr<ShmRequest> read = ReadRestOfRead(fd, header);
  if (!read.ok()) return read.status();
  message.read = *std::move(read);
  return message;
}

std::string EncodeShmPutRequest(const ShmPutRequest& request) {
  size_t headers_bytes = 0;
  for (const ShmPutEntry& e : request.entries) headers_bytes += e.header.size();
  std::string out;
  out.reserve(kShmRequestHeaderBytes + kShmPutEntryBytes * request.entries.size() + headers_bytes);
  PutU32(&out, kShmPutMagic);
  PutU32(&out, static_cast<uint32_t>(request.entries.size()));
  PutU32(&out, static_cast<uint32_t>(headers_bytes));
  PutU32(&out, 0);
  for (const ShmPutEntry& e : request.entries) {
    PutU64(&out, e.offset);
    PutU64(&out, e.size);
    PutU64(&out, e.checksum);
    PutU32(&out, static_cast<uint32_t>(e.header.size()));
  }
  for (const ShmPutEntry& e : request.entries) out += e.header;
  return out;
}

absl::Status WriteShmPutRequest(int fd, const ShmPutRequest& request, int data_fd) {
  return WriteAll(fd, EncodeShmPutRequest(request), absl::MakeConstSpan(&data_fd, 1));
}

absl::Status WriteShmPutResponse(int fd, const ShmPutResponse& response) {
  return WriteAll(fd, EncodePutAnswers(kShmPutMagic, response, kShmMaxMessageBytes), {});
}

absl::StatusOr<ShmPutResponse> ReadShmPutResponse(int fd) {
  return DecodePutAnswers(
      kShmPutMagic, kShmMaxPutEntries, kShmMaxMessageBytes,
      [fd](char* data, size_t size) { return ReadExactly(fd, data, size, nullptr, nullptr); }, "shm put response");
}

absl::Status WriteShmResponse(int fd, const ShmResponse& response, absl::Span<const int> fds) {
  std::string message(response.status.message().substr(0, kShmMaxMessageBytes));
  const bool ok = response.status.ok();
  if (!ok) fds = {};
  if (fds.size() > kShmMaxFds) {
    return absl::InvalidArgumentError(absl::StrCat("shm response with ", fds.size(), " descriptors > ", kShmMaxFds));
  }
  std::string out;
  out.reserve(kShmResponseHeaderBytes + message.size() + kShmEntryBytes * response.entries.size());
  PutU32(&out, kShmMagic);
  PutU32(&out, static_cast<uint32_t>(response.status.code()));
  PutU32(&out, ok ? static_cast<uint32_t>(response.entries.size()) : 0);
  PutU32(&out, static_cast<uint32_t>(message.size()));
  PutU32(&out, static_cast<uint32_t>(fds.size()));
  PutU32(&out, 0);
  out += message;
  if (ok) {
    for (const ShmEntrySpan& e : response.entries) {
      PutU32(&out, e.fd_index);
      PutU64(&out, e.offset);
      PutU64(&out, e.size);
      PutU64(&out, e.checksum);
    }
  }
  return WriteAll(fd, out, fds);
}

absl::StatusOr<ShmResponse> ReadShmResponse(int fd, std::vector<int>* fds) {
  fds->clear();
  char header[kShmResponseHeaderBytes];
  absl::Status s = ReadExactly(fd, header, sizeof(header), fds, nullptr);
  auto fail = [&](absl::Status status) -> absl::StatusOr<ShmResponse> {
    CloseAll(*fds);
    return status;
  };
  if (!s.ok()) return fail(s);
  if (GetU32(header) != kShmMagic) return fail(absl::InvalidArgumentError("shm response: bad magic"));
  const uint32_t code = GetU32(header + 4);
  const uint32_t count = GetU32(header + 8);
  const uint32_t message_bytes = GetU32(header + 12);
  const uint32_t fd_count = GetU32(header + 16);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated) || count > kShmMaxKeys ||
      message_bytes > kShmMaxMessageBytes || fd_count > kShmMaxFds || (code != 0 && (count != 0 || fd_count != 0))) {
    return fail(absl::InvalidArgumentError("shm response: malformed header"));
  }
  std::string body(message_bytes + kShmEntryBytes * static_cast<size_t>(count), '\0');
  if (absl::Status r = ReadExactly(fd, body.data(), body.size(), fds, nullptr); !r.ok()) return fail(r);
  if (fds->size() != fd_count) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("shm response: ", fds->size(), " descriptors arrived, the header says ", fd_count)));
  }
  ShmResponse response;
  response.status = absl::Status(static_cast<absl::StatusCode>(code), body.substr(0, message_bytes));
  response.entries.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = body.data() + message_bytes + kShmEntryBytes * i;
    response.entries[i] = ShmEntrySpan{GetU32(p), GetU64(p + 4), GetU64(p + 12), GetU64(p + 20)};
    if (response.entries[i].fd_index >= fd_count) {
      return fail(absl::InvalidArgumentError(absl::StrCat("shm response: entry ", i, " names descriptor ",
                                                          response.entries[i].fd_index, " of ", fd_count)));
    }
  }
  return response;
}

absl::StatusOr<common::Socket> ConnectShmSocket(const std::string& path, absl::Duration timeout) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shm socket path: ", path));
  }
  common::Socket sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return absl::UnavailableError(absl::StrCat("shm socket: ", std::strerror(errno)));
  SetShmSocketTimeout(sock.fd(), timeout);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to the shm socket ", path, ": ", std::strerror(errno)));
  }
  return sock;
}

void SetShmSocketTimeout(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::Status CheckShmPeer(uid_t uid, pid_t pid, absl::Span<const uid_t> allowed_uids) {
  if (std::find(allowed_uids.begin(), allowed_uids.end(), uid) != allowed_uids.end()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("shm peer pid ", pid, " runs as uid ", uid, ", not an allowed uid (",
                                                  absl::StrJoin(allowed_uids, ","), ")"));
}

}  // namespace hybridserve::cachestore
