#include "cachestore/shm_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/shm_protocol.h"

namespace hybridserve::cachestore {
namespace {

// Closes a descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

ShmEntries::ShmEntries(ShmEntries&& other) noexcept
    : mapped_(std::exchange(other.mapped_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      entries_(std::move(other.entries_)) {}

ShmEntries& ShmEntries::operator=(ShmEntries&& other) noexcept {
  if (this != &other) {
    if (mapped_ != nullptr) munmap(mapped_, mapped_size_);
    mapped_ = std::exchange(other.mapped_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    entries_ = std::move(other.entries_);
  }
  return *this;
}

ShmEntries::~ShmEntries() {
  if (mapped_ != nullptr) munmap(mapped_, mapped_size_);
}

absl::StatusOr<ShmResponse> ShmReader::Receive(uint64_t lease_id, absl::Span<const Hash128> keys, bool* verdict,
                                               int* memfd_out) const {
  *memfd_out = -1;
  if (verdict != nullptr) *verdict = false;
  if (keys.empty() || keys.size() > kShmMaxKeys) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys: a shm read takes 1 to ", kShmMaxKeys));
  }
  sockaddr_un addr{};
  if (options_.socket_path.empty() || options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shm socket path: ", options_.socket_path));
  }
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::UnavailableError(absl::StrCat("shm socket: ", std::strerror(errno)));
  FdCloser sock_closer(sock);
  SetShmSocketTimeout(sock, options_.timeout);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.socket_path.data(), options_.socket_path.size());
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the shm socket ", options_.socket_path, ": ", std::strerror(errno)));
  }
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
  int memfd = -1;
  absl::StatusOr<ShmResponse> response = ReadShmResponse(sock, &memfd);
  FdCloser memfd_closer(memfd);  // released below once the descriptor passed every check
  if (!response.ok()) return response.status();
  if (!response->status.ok()) {
    const absl::StatusCode code = response->status.code();
    if (verdict != nullptr) *verdict = code == absl::StatusCode::kNotFound || code == absl::StatusCode::kDataLoss;
    return response->status;
  }
  if (response->entries.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm response: ", response->entries.size(), " entries for ", keys.size(), " keys"));
  }
  const uint64_t total = response->memfd_bytes;
  for (size_t i = 0; i < response->entries.size(); ++i) {
    const ShmEntrySpan& e = response->entries[i];
    if (e.offset > total || e.size > total - e.offset) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm entry ", i, " at ", e.offset, "+", e.size, " lies outside the memfd of ", total, " bytes"));
    }
  }
  if (total > 0) {
    // Only a memfd that nobody can change any more is read.
    struct stat st {};
    if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != total) {
      return absl::FailedPreconditionError(absl::StrCat("shm descriptor is not a file of ", total, " bytes"));
    }
    const int seals = fcntl(memfd, F_GET_SEALS);
    if (seals < 0 || (seals & ShmRequiredSeals()) != ShmRequiredSeals()) {
      return absl::FailedPreconditionError(absl::StrCat("shm descriptor is not sealed (seals ", seals, ")"));
    }
    *memfd_out = dup(memfd);
    if (*memfd_out < 0) return absl::UnavailableError(absl::StrCat("dup: ", std::strerror(errno)));
  }
  return response;
}

absl::StatusOr<ShmEntries> ShmReader::Read(uint64_t lease_id, absl::Span<const Hash128> keys, bool* verdict) const {
  int memfd = -1;
  absl::StatusOr<ShmResponse> response = Receive(lease_id, keys, verdict, &memfd);
  FdCloser memfd_closer(memfd);
  if (!response.ok()) return response.status();
  ShmEntries out;
  if (memfd >= 0) {
    void* p = mmap(nullptr, response->memfd_bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, memfd, 0);
    if (p == MAP_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat("cannot map the shm descriptor: ", std::strerror(errno)));
    }
    out.mapped_ = p;
    out.mapped_size_ = response->memfd_bytes;
  }
  out.entries_.reserve(keys.size());
  for (size_t i = 0; i < response->entries.size(); ++i) {
    const ShmEntrySpan& e = response->entries[i];
    const char* base = static_cast<const char*>(out.mapped_);
    absl::string_view bytes = e.size == 0 ? absl::string_view() : absl::string_view(base + e.offset, e.size);
    if (common::Checksum64(bytes.data(), bytes.size()) != e.checksum) {
      return absl::DataLossError(absl::StrCat("shm entry ", i, " (key ", keys[i].ToHex(), ") failed its checksum"));
    }
    out.entries_.push_back(bytes);
  }
  return out;
}

absl::Status ShmReader::ReadInto(uint64_t lease_id, absl::Span<const Hash128> keys, absl::Span<std::string> out,
                                 bool* verdict) const {
  if (out.size() != keys.size()) return absl::InvalidArgumentError("ReadInto: as many outputs as keys");
  int memfd = -1;
  absl::StatusOr<ShmResponse> response = Receive(lease_id, keys, verdict, &memfd);
  FdCloser memfd_closer(memfd);
  if (!response.ok()) return response.status();
  for (size_t i = 0; i < response->entries.size(); ++i) {
    const ShmEntrySpan& e = response->entries[i];
    std::string& dst = out[i];
    dst.resize(e.size);
    for (uint64_t done = 0; done < e.size;) {
      const ssize_t n = pread(memfd, dst.data() + done, e.size - done, static_cast<off_t>(e.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return absl::FailedPreconditionError(absl::StrCat("reading the shm descriptor: ", std::strerror(errno)));
      done += static_cast<uint64_t>(n);
    }
    // The copy is what gets used, so the copy is what is verified.
    if (common::Checksum64(dst.data(), dst.size()) != e.checksum) {
      return absl::DataLossError(absl::StrCat("shm entry ", i, " (key ", keys[i].ToHex(), ") failed its checksum"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hybridserve::cachestore
