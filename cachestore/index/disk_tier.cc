#include "cachestore/index/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/logging.h"

namespace hybridserve::cachestore {
namespace {

constexpr char kMagic[8] = {'H', 'S', 'D', 'T', 'I', 'E', 'R', '\0'};
constexpr char kLockName[] = "LOCK";
constexpr char kTempMarker[] = ".tmp-";
constexpr size_t kHexKeyChars = 32;
// The header's checksum covers the bytes before it.
constexpr size_t kHeaderChecksumOffset = 56;

std::string Errno(absl::string_view what, absl::string_view path, int err) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(err));
}

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}
uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

uint64_t BodyChecksum(absl::string_view metadata, absl::string_view payload) {
  common::StreamingChecksum sum;
  sum.Update(metadata.data(), metadata.size());
  sum.Update(payload.data(), payload.size());
  return sum.Digest();
}

void EncodeHeader(const Hash128& key, absl::string_view metadata, absl::string_view payload,
                  char (&header)[kDiskTierHeaderBytes]) {
  std::memset(header, 0, sizeof(header));
  std::memcpy(header, kMagic, sizeof(kMagic));
  PutU32(kDiskTierFormatVersion, header + 8);
  PutU64(key.lo, header + 16);
  PutU64(key.hi, header + 24);
  PutU64(metadata.size(), header + 32);
  PutU64(payload.size(), header + 40);
  PutU64(BodyChecksum(metadata, payload), header + 48);
  PutU64(common::Checksum64(header, kHeaderChecksumOffset), header + kHeaderChecksumOffset);
}

// Parses 32 lowercase hex digits (Hash128::ToHex); false for anything else.
bool ParseHexKey(absl::string_view hex, Hash128* key) {
  if (hex.size() != kHexKeyChars) return false;
  uint64_t words[2] = {0, 0};
  for (size_t i = 0; i < kHexKeyChars; ++i) {
    const char c = hex[i];
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    words[i / 16] = (words[i / 16] << 4) | digit;
  }
  key->hi = words[0];
  key->lo = words[1];
  return true;
}

absl::Status PreadAll(int fd, char* out, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat("read failed: ", std::strerror(errno)));
    }
    if (n == 0) return absl::DataLossError("file ended early");
    out += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Reads and checks the header of the entry file open as `fd` as `key`'s,
// and that the file is exactly as long as it says: magic, header checksum,
// format version, key, lengths. DATA_LOSS saying what failed.
struct HeaderFields {
  uint64_t metadata_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t body_checksum = 0;
};
absl::StatusOr<HeaderFields> ReadHeader(int fd, const Hash128& key) {
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::DataLossError(absl::StrCat("fstat failed: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return absl::DataLossError("not a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kDiskTierHeaderBytes) {
    return absl::DataLossError(absl::StrCat("file of ", file_bytes, " bytes is shorter than the header"));
  }
  char header[kDiskTierHeaderBytes];
  if (absl::Status s = PreadAll(fd, header, sizeof(header), 0); !s.ok()) return s;
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) return absl::DataLossError("bad magic");
  if (GetU64(header + kHeaderChecksumOffset) != common::Checksum64(header, kHeaderChecksumOffset)) {
    return absl::DataLossError("header checksum mismatch");
  }
  const uint32_t version = GetU32(header + 8);
  if (version != kDiskTierFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("unknown format version ", version, " (this build reads ", kDiskTierFormatVersion, ")"));
  }
  const Hash128 stored{GetU64(header + 16), GetU64(header + 24)};
  if (stored != key) return absl::DataLossError(absl::StrCat("header key ", stored.ToHex(), " is not the file's"));
  HeaderFields h;
  h.metadata_bytes = GetU64(header + 32);
  h.payload_bytes = GetU64(header + 40);
  h.body_checksum = GetU64(header + 48);
  const uint64_t body_bytes = file_bytes - kDiskTierHeaderBytes;
  if (h.metadata_bytes > body_bytes || h.payload_bytes != body_bytes - h.metadata_bytes) {
    return absl::DataLossError(absl::StrCat("file of ", file_bytes, " bytes, header says ",
                                            kDiskTierHeaderBytes + h.metadata_bytes + h.payload_bytes, " (torn)"));
  }
  return h;
}

// Reads the entry file open as `fd` and verifies it as `key`'s (ReadHeader,
// then the body checksum); DATA_LOSS saying what failed.
absl::StatusOr<DiskTierEntry> ReadVerified(int fd, const Hash128& key) {
  absl::StatusOr<HeaderFields> h = ReadHeader(fd, key);
  if (!h.ok()) return h.status();
  DiskTierEntry entry;
  entry.metadata.resize(h->metadata_bytes);
  entry.payload.resize(h->payload_bytes);
  if (absl::Status s = PreadAll(fd, entry.metadata.data(), h->metadata_bytes, kDiskTierHeaderBytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = PreadAll(fd, entry.payload.data(), h->payload_bytes, kDiskTierHeaderBytes + h->metadata_bytes);
      !s.ok()) {
    return s;
  }
  if (BodyChecksum(entry.metadata, entry.payload) != h->body_checksum) {
    return absl::DataLossError("body checksum mismatch");
  }
  return entry;
}

// What Open reads of a file: its header, checked, and the metadata (not yet
// verified: the body checksum covers it with the payload, and every Get
// checks it).
absl::StatusOr<std::string> ReadHeaderAndMetadata(int fd, const Hash128& key, bool want_metadata) {
  absl::StatusOr<HeaderFields> h = ReadHeader(fd, key);
  if (!h.ok()) return h.status();
  std::string metadata;
  if (want_metadata) {
    metadata.resize(h->metadata_bytes);
    if (absl::Status s = PreadAll(fd, metadata.data(), h->metadata_bytes, kDiskTierHeaderBytes); !s.ok()) return s;
  }
  return metadata;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& directory, uint64_t byte_budget,
                                                         const EntryVisitor& visit) {
  if (directory.empty()) return absl::InvalidArgumentError("disk tier directory is empty");
  if (byte_budget == 0) return absl::InvalidArgumentError("disk tier byte_budget is 0");
  struct stat st;
  if (stat(directory.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("disk tier directory ", directory, " exists and is not a directory"));
    }
  } else {
    // mkdir -p: each missing component in turn.
    for (size_t pos = 0; pos != std::string::npos;) {
      pos = directory.find('/', pos + 1);
      const std::string prefix = directory.substr(0, pos);
      // Only this user: the entries hold every tenant's cached prompts.
      if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
        return absl::FailedPreconditionError(Errno("disk tier cannot create directory", prefix, errno));
      }
    }
    if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("disk tier directory ", directory, " is not a directory after creating it"));
    }
  }
  // access() answers EROFS for a read-only mount even to root.
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(Errno("disk tier directory is not writable:", directory, errno));
  }
  const int dir_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return absl::FailedPreconditionError(Errno("disk tier cannot open directory", directory, errno));
  const std::string lock_path = absl::StrCat(directory, "/", kLockName);
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    const int err = errno;
    close(dir_fd);
    return absl::FailedPreconditionError(Errno("disk tier directory is not writable: cannot open", lock_path, err));
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(lock_fd);
    close(dir_fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat("disk tier directory ", directory,
                                                        " is in use by another DiskTier (", lock_path, " is locked)"));
    }
    return absl::FailedPreconditionError(Errno("disk tier cannot lock", lock_path, err));
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(directory, byte_budget, dir_fd, lock_fd));
  if (absl::Status s = tier->Rebuild(visit); !s.ok()) return s;
  return tier;
}

DiskTier::DiskTier(std::string directory, uint64_t byte_budget, int dir_fd, int lock_fd)
    : directory_(std::move(directory)), byte_budget_(byte_budget), dir_fd_(dir_fd), lock_fd_(lock_fd), pid_(getpid()) {}

DiskTier::~DiskTier() {
  close(lock_fd_);  // Releases the flock.
  close(dir_fd_);
}

std::string DiskTier::EntryPath(const Hash128& key) const { return absl::StrCat(directory_, "/", key.ToHex()); }

absl::Status DiskTier::Rebuild(const EntryVisitor& visit) {
  struct Found {
    Hash128 key;
    uint64_t file_bytes;
    int64_t mtime_ns;
    std::string name;
    std::string metadata;  // kept only for `visit`
  };
  std::vector<Found> found;
  DiskTierStats scan;
  bool removed_any = false;
  DIR* dir = opendir(directory_.c_str());
  if (dir == nullptr) return absl::FailedPreconditionError(Errno("disk tier cannot list", directory_, errno));
  while (const struct dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    if (name == "." || name == ".." || name == kLockName) continue;
    const std::string path = absl::StrCat(directory_, "/", name);
    Hash128 key;
    if (name.size() > kHexKeyChars && name.compare(kHexKeyChars, sizeof(kTempMarker) - 1, kTempMarker) == 0 &&
        ParseHexKey(absl::string_view(name).substr(0, kHexKeyChars), &key)) {
      // The flock says no put is in flight: a crash left it.
      if (unlink(path.c_str()) == 0) {
        ++scan.temp_files_removed;
        removed_any = true;
      } else {
        LOG(WARNING) << Errno("disk tier cannot remove temp file", path, errno);
      }
      continue;
    }
    if (!ParseHexKey(name, &key)) {
      ++scan.ignored_files;
      continue;
    }
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    // The header only (and the metadata for `visit`): a start costs a small
    // read a file, not the directory's bytes; every Get verifies the body.
    absl::StatusOr<std::string> entry = fd < 0
                                            ? absl::DataLossError(absl::StrCat("open failed: ", std::strerror(errno)))
                                            : ReadHeaderAndMetadata(fd, key, static_cast<bool>(visit));
    struct stat st;
    const bool stat_ok = fd >= 0 && fstat(fd, &st) == 0;
    if (fd >= 0) close(fd);
    if (!entry.ok() || !stat_ok) {
      LOG(WARNING) << "disk tier removes unusable entry file " << path << ": "
                   << (entry.ok() ? "fstat failed" : entry.status().message());
      unlink(path.c_str());
      ++scan.corrupt_files;
      removed_any = true;
      continue;
    }
    found.push_back(Found{key, static_cast<uint64_t>(st.st_size), MtimeNs(st), name, *std::move(entry)});
  }
  closedir(dir);
  // Least recently used first; the name breaks ties so the order is total.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.name < b.name;
  });
  {
    absl::MutexLock lock(&mu_);
    counters_ = scan;
    for (const Found& f : found) {
      lru_.push_front(f.key);
      index_[f.key] = IndexEntry{f.file_bytes, next_generation_++, lru_.begin()};
      bytes_ += f.file_bytes;
      last_stamp_ns_ = std::max(last_stamp_ns_, f.mtime_ns);
    }
    const int64_t evictions_before = counters_.evictions;
    EvictForLocked(0);
    if (counters_.evictions != evictions_before) removed_any = true;
    // Only the survivors are visited.
    if (visit) {
      size_t kept = 0;
      for (Found& f : found) {
        if (!index_.contains(f.key)) continue;
        if (&found[kept] != &f) found[kept] = std::move(f);
        ++kept;
      }
      found.resize(kept);
    }
  }
  if (removed_any) SyncDirectory();
  if (visit) {
    for (const Found& f : found) visit(f.key, f.metadata);
  }
  return absl::OkStatus();
}

void DiskTier::RemoveLocked(const Hash128& key) {
  auto it = index_.find(key);
  DCHECK(it != index_.end());
  const std::string path = EntryPath(key);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    LOG(WARNING) << Errno("disk tier cannot remove", path, errno);
  }
  bytes_ -= it->second.file_bytes;
  lru_.erase(it->second.lru_position);
  index_.erase(it);
}

void DiskTier::EvictForLocked(uint64_t incoming, std::vector<Hash128>* evicted) {
  while (!lru_.empty() && bytes_ + incoming > byte_budget_) {
    if (evicted != nullptr) evicted->push_back(lru_.back());
    RemoveLocked(lru_.back());
    ++counters_.evictions;
  }
}

void DiskTier::StampLocked(int fd) {
  struct timespec times[2];
  NextStampLocked(times);
  futimens(fd, times);  // Best effort: recency only orders a later Open.
}

void DiskTier::NextStampLocked(struct timespec times[2]) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  last_stamp_ns_ = std::max(now_ns, last_stamp_ns_ + 1);
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = last_stamp_ns_ / 1000000000;
  times[1].tv_nsec = last_stamp_ns_ % 1000000000;
}

void DiskTier::SyncDirectory() const {
  if (fsync(dir_fd_) != 0) LOG(WARNING) << Errno("disk tier cannot fsync", directory_, errno);
}

absl::Status DiskTier::Put(const Hash128& key, absl::string_view metadata, absl::string_view payload,
                           std::vector<Hash128>* evicted) {
  const uint64_t file_bytes = kDiskTierHeaderBytes + metadata.size() + payload.size();
  if (file_bytes > byte_budget_) {
    return absl::ResourceExhaustedError(absl::StrCat("disk tier entry ", key.ToHex(), " of ", file_bytes,
                                                     " bytes (header included) exceeds the byte_budget ",
                                                     byte_budget_));
  }
  uint64_t temp_number;
  {
    absl::MutexLock lock(&mu_);
    temp_number = next_temp_++;
  }
  const std::string temp_path = absl::StrCat(EntryPath(key), kTempMarker, pid_, "-", temp_number);
  const int fd = open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(Errno("disk tier put cannot create", temp_path, errno));
  auto fail = [&](absl::string_view what) {
    const absl::Status status = absl::InternalError(Errno(what, temp_path, errno));
    close(fd);
    unlink(temp_path.c_str());
    return status;
  };

  char header[kDiskTierHeaderBytes];
  EncodeHeader(key, metadata, payload, header);
  struct iovec parts[3] = {{header, sizeof(header)},
                           {const_cast<char*>(metadata.data()), metadata.size()},
                           {const_cast<char*>(payload.data()), payload.size()}};
  int first = 0;
  while (first < 3) {
    const ssize_t n = writev(fd, parts + first, 3 - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("disk tier put cannot write");
    }
    size_t left = static_cast<size_t>(n);
    while (first < 3 && left >= parts[first].iov_len) {
      left -= parts[first].iov_len;
      ++first;
    }
    if (first < 3) {
      parts[first].iov_base = static_cast<char*>(parts[first].iov_base) + left;
      parts[first].iov_len -= left;
    }
  }
  if (fsync(fd) != 0) return fail("disk tier put cannot fsync");

  {
    absl::MutexLock lock(&mu_);
    // The old entry of this key goes with the rename; its bytes make room.
    if (index_.contains(key)) {
      auto it = index_.find(key);
      bytes_ -= it->second.file_bytes;
      lru_.erase(it->second.lru_position);
      index_.erase(it);
    }
    EvictForLocked(file_bytes, evicted);
    StampLocked(fd);
    const std::string path = EntryPath(key);
    if (rename(temp_path.c_str(), path.c_str()) != 0) {
      const absl::Status status =
          absl::InternalError(Errno("disk tier put cannot rename into place", temp_path, errno));
      unlink(path.c_str());  // Whatever was there is no longer indexed.
      close(fd);
      unlink(temp_path.c_str());
      return status;
    }
    lru_.push_front(key);
    index_[key] = IndexEntry{file_bytes, next_generation_++, lru_.begin()};
    bytes_ += file_bytes;
  }
  close(fd);
  SyncDirectory();
  return absl::OkStatus();
}

absl::StatusOr<DiskTierEntry> DiskTier::Get(const Hash128& key) {
  int fd;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++counters_.misses;
      return absl::NotFoundError(absl::StrCat("disk tier has no entry ", key.ToHex()));
    }
    fd = open(EntryPath(key).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      const int err = errno;
      LOG(WARNING) << Errno("disk tier cannot open indexed entry", EntryPath(key), err);
      RemoveLocked(key);
      ++counters_.corrupt_files;
      ++counters_.misses;
      return absl::NotFoundError(
          absl::StrCat("disk tier entry ", key.ToHex(), " is unreadable (", std::strerror(err), "), removed"));
    }
    generation = it->second.generation;
    lru_.splice(lru_.begin(), lru_, it->second.lru_position);
    StampLocked(fd);
  }
  absl::StatusOr<DiskTierEntry> entry = ReadVerified(fd, key);
  close(fd);
  absl::MutexLock lock(&mu_);
  if (!entry.ok()) {
    LOG(WARNING) << "disk tier removes corrupt entry file " << EntryPath(key) << ": " << entry.status().message();
    ++counters_.corrupt_files;
    ++counters_.misses;
    // A Put since our open replaced the file: that one is not the one we read.
    auto it = index_.find(key);
    if (it != index_.end() && it->second.generation == generation) RemoveLocked(key);
    return absl::NotFoundError(absl::StrCat("disk tier entry ", key.ToHex(), " failed verification (",
                                            entry.status().message(), "), removed"));
  }
  ++counters_.hits;
  return entry;
}

bool DiskTier::Contains(const Hash128& key) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

bool DiskTier::Touch(const Hash128& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second.lru_position);
  struct timespec times[2];
  NextStampLocked(times);
  // Best effort, as StampLocked: the name is the key's hex, never a link.
  utimensat(dir_fd_, key.ToHex().c_str(), times, AT_SYMLINK_NOFOLLOW);
  return true;
}

bool DiskTier::Erase(const Hash128& key) {
  {
    absl::MutexLock lock(&mu_);
    if (!index_.contains(key)) return false;
    RemoveLocked(key);
  }
  SyncDirectory();
  return true;
}

DiskTierStats DiskTier::Stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats stats = counters_;
  stats.entries = static_cast<int64_t>(index_.size());
  stats.bytes = static_cast<int64_t>(bytes_);
  return stats;
}

}  // namespace hybridserve::cachestore
