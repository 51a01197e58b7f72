#include "cachestore/shm_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/shm_protocol.h"

namespace hybridserve::cachestore {
namespace {

// Closes descriptors on scope exit.
class FdsCloser {
 public:
  explicit FdsCloser(std::vector<int>& fds) : fds_(fds) {}
  ~FdsCloser() {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  FdsCloser(const FdsCloser&) = delete;
  FdsCloser& operator=(const FdsCloser&) = delete;

 private:
  std::vector<int>& fds_;
};

// A descriptor the reader may read: a regular file opened read-only (one
// that could write the cachestore's bytes is refused). Its size, in *size.
absl::Status CheckDescriptor(int fd, size_t index, uint64_t* size) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDONLY) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm descriptor ", index, " is not opened read-only (flags ", flags, ")"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("shm descriptor ", index, " is not a regular file"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return absl::OkStatus();
}

}  // namespace

absl::Status ShmReader::ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                                 bool* verdict) const {
  if (verdict != nullptr) *verdict = false;
  if (keys.empty() || keys.size() > kShmMaxReadKeys) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys: a shm read takes 1 to ", kShmMaxReadKeys));
  }
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadInto: as many outputs as keys");
  sockaddr_un addr{};
  if (options_.socket_path.empty() || options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shm socket path: ", options_.socket_path));
  }
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::UnavailableError(absl::StrCat("shm socket: ", std::strerror(errno)));
  std::vector<int> sock_fd = {sock};
  FdsCloser sock_closer(sock_fd);
  SetShmSocketTimeout(sock, options_.timeout);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.socket_path.data(), options_.socket_path.size());
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the shm socket ", options_.socket_path, ": ", std::strerror(errno)));
  }
  for (size_t begin = 0; begin < keys.size(); begin += kShmMaxKeys) {
    const size_t n = std::min<size_t>(kShmMaxKeys, keys.size() - begin);
    if (absl::Status s = ReadChunk(sock, lease_id, keys.subspan(begin, n), out.subspan(begin, n), begin, verdict);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmReader::ReadChunk(int sock, uint64_t lease_id, absl::Span<const Hash128> keys,
                                  absl::Span<std::string> out, size_t first_index, bool* verdict) const {
  ShmRequest request;
  request.lease_id = lease_id;
  request.keys.assign(keys.begin(), keys.end());
  const std::string frame = EncodeShmRequest(request);
  for (size_t sent = 0; sent < frame.size();) {
    const ssize_t n = send(sock, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("shm request: ", std::strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  std::vector<int> fds;
  absl::StatusOr<ShmResponse> response = ReadShmResponse(sock, &fds);
  FdsCloser fds_closer(fds);  // every path: the bytes are copied out below
  if (!response.ok()) return response.status();
  if (!response->status.ok()) {
    const absl::StatusCode code = response->status.code();
    if (verdict != nullptr) *verdict = code == absl::StatusCode::kNotFound || code == absl::StatusCode::kDataLoss;
    if (first_index == 0) return response->status;
    // The server numbers this request's keys from 0.
    return absl::Status(code, absl::StrCat("keys from ", first_index, " on: ", response->status.message()));
  }
  if (response->entries.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm response: ", response->entries.size(), " entries for ", keys.size(), " keys"));
  }
  std::vector<uint64_t> sizes(fds.size());
  for (size_t f = 0; f < fds.size(); ++f) {
    if (absl::Status s = CheckDescriptor(fds[f], f, &sizes[f]); !s.ok()) return s;
  }
  for (size_t i = 0; i < response->entries.size(); ++i) {
    const ShmEntrySpan& e = response->entries[i];
    const uint64_t file_size = sizes[e.fd_index];  // fd_index checked by ReadShmResponse
    if (e.offset > file_size || e.size > file_size - e.offset) {
      return absl::FailedPreconditionError(absl::StrCat("shm entry ", first_index + i, " at ", e.offset, "+", e.size,
                                                        " lies outside its descriptor of ", file_size, " bytes"));
    }
    std::string& dst = out[i];
    dst.resize(e.size);
    for (uint64_t done = 0; done < e.size;) {
      const ssize_t n = pread(fds[e.fd_index], dst.data() + done, e.size - done, static_cast<off_t>(e.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::FailedPreconditionError(absl::StrCat("reading the shm descriptor: ", std::strerror(errno)));
      }
      done += static_cast<uint64_t>(n);
    }
    // The copy is what gets used, so the copy is what is verified.
    if (common::Checksum64(dst.data(), dst.size()) != e.checksum) {
      return absl::DataLossError(
          absl::StrCat("shm entry ", first_index + i, " (key ", keys[i].ToHex(), ") failed its checksum"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
