#include "cachestore/client/shm_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/cache_client.h"
#include "cachestore/wire/shm_protocol.h"
#include "common/status_macros.h"

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

// Reads bytes [offset, offset + total) of `fd` into `segments` in order
// (their sizes add up to total), in as few preadv calls as the kernel allows.
absl::Status PreadFully(int fd, absl::Span<const absl::Span<char>> segments, uint64_t offset) {
  std::vector<iovec> iov;
  iov.reserve(segments.size());
  for (const absl::Span<char>& s : segments) {
    if (!s.empty()) iov.push_back(iovec{s.data(), s.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t n = preadv(fd, iov.data() + first, count, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("reading the shm descriptor: ", n == 0 ? "end of file" : std::strerror(errno)));
    }
    offset += static_cast<uint64_t>(n);
    // Past the segments filled whole, into the one filled in part.
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      iovec& v = iov[first];
      const size_t take = std::min(left, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + take;
      v.iov_len -= take;
      left -= take;
      if (v.iov_len == 0) ++first;
    }
  }
  return absl::OkStatus();
}

// The XXH3-64 of the segments' bytes, in order (Checksum64 of them joined).
uint64_t ChecksumOf(absl::Span<const absl::Span<char>> segments) {
  if (segments.size() == 1) return common::Checksum64(segments[0].data(), segments[0].size());
  common::StreamingChecksum sum;
  for (const absl::Span<char>& s : segments) sum.Update(s.data(), s.size());
  return sum.Digest();
}

}  // namespace

absl::Status ShmReader::ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                                 bool* verdict) const {
  if (verdict != nullptr) *verdict = false;
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadInto: as many outputs as keys");
  return Read(
      lease_id, keys,
      [out](size_t index, uint64_t size, std::vector<absl::Span<char>>* segments) {
        std::string& dst = out[index];
        dst.resize(size);
        segments->assign(1, absl::MakeSpan(dst));
        return absl::OkStatus();
      },
      verdict);
}

absl::Status ShmReader::ReadScattered(uint64_t lease_id, absl::Span<const Hash128> keys,
                                      absl::Span<const EntrySegments> out, bool* verdict) const {
  if (verdict != nullptr) *verdict = false;
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadScattered: as many destinations as keys");
  return Read(
      lease_id, keys,
      [out](size_t index, uint64_t size, std::vector<absl::Span<char>>* segments) {
        RETURN_IF_ERROR(CheckEntryFits(index, size, out[index]));
        *segments = out[index].segments;
        return absl::OkStatus();
      },
      verdict);
}

absl::Status ShmReader::Read(uint64_t lease_id, absl::Span<const Hash128> keys, Destination destination,
                             bool* verdict) const {
  if (keys.empty() || keys.size() > kShmMaxReadKeys) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys: a shm read takes 1 to ", kShmMaxReadKeys));
  }
  ASSIGN_OR_RETURN(common::Socket sock, ConnectShmSocket(options_.socket_path, options_.timeout));
  for (size_t begin = 0; begin < keys.size(); begin += kShmMaxKeys) {
    const size_t n = std::min<size_t>(kShmMaxKeys, keys.size() - begin);
    if (absl::Status s = ReadChunk(sock.fd(), lease_id, keys.subspan(begin, n), destination, begin, verdict); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmReader::ReadChunk(int sock, uint64_t lease_id, absl::Span<const Hash128> keys, Destination destination,
                                  size_t first_index, bool* verdict) const {
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
    std::vector<absl::Span<char>> segments;
    if (absl::Status s = destination(first_index + i, e.size, &segments); !s.ok()) {
      // The entry's size is the cachestore's answer; a gRPC read gets it too.
      if (verdict != nullptr) *verdict = true;
      return s;
    }
    RETURN_IF_ERROR(PreadFully(fds[e.fd_index], segments, e.offset));
    // The copy is what gets used, so the copy is what is verified.
    if (ChecksumOf(segments) != e.checksum) {
      return absl::DataLossError(
          absl::StrCat("shm entry ", first_index + i, " (key ", keys[i].ToHex(), ") failed its checksum"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
