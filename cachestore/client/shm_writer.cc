#include "cachestore/client/shm_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachestore/client/client_messages.h"
#include "cachestore/wire/shm_protocol.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace hybridserve::cachestore {
namespace {

// Copies `bytes` to `dst` a cache-sized piece at a time, hashing each
// piece while it is hot (when `hash`); the XXH3-64 of the bytes.
uint64_t CopyHashed(char* dst, absl::string_view bytes, bool hash) {
  constexpr size_t kPiece = size_t{256} << 10;
  common::StreamingChecksum sum;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    const size_t n = std::min(kPiece, bytes.size() - at);
    std::memcpy(dst + at, bytes.data() + at, n);
    if (hash) sum.Update(bytes.data() + at, n);
  }
  return hash ? sum.Digest() : 0;
}

}  // namespace

class ShmWriter::PutBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<PutBuffer>> Create() {
    const int fd = memfd_create("hybridserve-put", MFD_CLOEXEC);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("memfd_create: ", std::strerror(errno)));
    // What the cachestore gets is a read-only view: it can read the bytes,
    // not write into this process's buffer. (Without /proc, the memfd itself.)
    const int read_only = open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDONLY | O_CLOEXEC);
    return std::unique_ptr<PutBuffer>(new PutBuffer(fd, read_only));
  }
  ~PutBuffer() {
    if (data_ != nullptr) munmap(data_, size_);
    if (read_only_ >= 0) close(read_only_);
    close(fd_);
  }
  PutBuffer(const PutBuffer&) = delete;
  PutBuffer& operator=(const PutBuffer&) = delete;

  // At least `size` bytes, mapped.
  absl::Status Reserve(size_t size) {
    if (size <= size_) return absl::OkStatus();
    if (data_ != nullptr) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return absl::UnavailableError(absl::StrCat("growing the put's memfd: ", std::strerror(errno)));
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return absl::UnavailableError(absl::StrCat("mapping the put's memfd: ", std::strerror(errno)));
    data_ = static_cast<char*>(p);
    size_ = size;
    return absl::OkStatus();
  }
  // The descriptor a request sends.
  int shared_fd() const { return read_only_ >= 0 ? read_only_ : fd_; }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  PutBuffer(int fd, int read_only) : fd_(fd), read_only_(read_only) {}
  const int fd_;
  const int read_only_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

ShmWriter::ShmWriter(ShmWriterOptions options) : options_(std::move(options)) {}

ShmWriter::~ShmWriter() = default;

absl::Status ShmWriter::Put(const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                            std::vector<absl::StatusOr<PutResult>>* results) {
  ASSIGN_OR_RETURN(common::Socket sock, ConnectShmSocket(options_.socket_path, options_.timeout));
  // A quarter of the headers' limit: SplitPutRequests estimates their sizes.
  for (const auto& [begin, end] :
       SplitPutRequests(entries, kShmMaxPutEntries, options_.request_bytes, kShmMaxPutHeadersBytes / 4)) {
    RETURN_IF_ERROR(PutRequest(sock.fd(), ns, entries.subspan(begin, end - begin), results));
  }
  return absl::OkStatus();
}

absl::Status ShmWriter::PutRequest(int sock, const ClientNamespace& ns, absl::Span<const PutManyEntry> entries,
                                   std::vector<absl::StatusOr<PutResult>>* results) {
  size_t total = 0;
  for (const PutManyEntry& e : entries) total += e.bytes.size();
  ASSIGN_OR_RETURN(std::unique_ptr<PutBuffer> buffer, TakeBuffer(std::max<size_t>(total, 1)));
  const v1::CacheNamespace ns_message = NamespaceMessage(ns);
  ShmPutRequest request;
  request.entries.resize(entries.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const PutManyEntry& e = entries[i];
    ShmPutEntry& out = request.entries[i];
    const uint64_t sum = CopyHashed(buffer->data() + offset, e.bytes, !e.checksum.has_value());
    out.offset = offset;
    out.size = e.bytes.size();
    out.checksum = e.checksum.value_or(sum);
    out.header = PutHeaderMessage(ns_message, *e.put, e.bytes.size()).SerializeAsString();
    offset += e.bytes.size();
  }
  RETURN_IF_ERROR(WriteShmPutRequest(sock, request, buffer->shared_fd()));
  ASSIGN_OR_RETURN(const ShmPutResponse response, ReadShmPutResponse(sock));
  RETURN_IF_ERROR(response.status);
  RETURN_IF_ERROR(AppendPutAnswers(response.answers, entries.size(), results));
  // The cachestore closed its descriptor before it answered: the memfd is
  // this process's alone again. (After a failure it is not kept: a
  // cachestore still reading it would see the next request's bytes.)
  KeepBuffer(std::move(buffer));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmWriter::PutBuffer>> ShmWriter::TakeBuffer(size_t size) {
  std::unique_ptr<PutBuffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    if (!kept_.empty()) {
      buffer = std::move(kept_.back());
      kept_.pop_back();
    }
  }
  if (buffer == nullptr) {
    ASSIGN_OR_RETURN(buffer, PutBuffer::Create());
  }
  RETURN_IF_ERROR(buffer->Reserve(size));
  return buffer;
}

void ShmWriter::KeepBuffer(std::unique_ptr<PutBuffer> buffer) {
  absl::MutexLock lock(&mu_);
  int64_t kept_bytes = static_cast<int64_t>(buffer->size());
  for (const std::unique_ptr<PutBuffer>& k : kept_) kept_bytes += static_cast<int64_t>(k->size());
  if (static_cast<int>(kept_.size()) < options_.kept_memfds && kept_bytes <= options_.kept_bytes) {
    kept_.push_back(std::move(buffer));
  }
}

}  // namespace hybridserve::cachestore
