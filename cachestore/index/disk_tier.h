#ifndef HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_H_

// A byte-budgeted store of cache entries in files of one local directory: the
// disk tier of issue 49 (docs/ARCHITECTURE.md section 4, "The disk tier").
// The cachestore uses it through DiskTierCache (disk_tier_cache.h).
//
// One file an entry, named by its key: `<dir>/<32 hex digits of the key>`
// (Hash128::ToHex, hi then lo). Its layout, every integer little-endian:
//
//   offset  size  field
//        0     8  magic "HSDTIER\0"
//        8     4  format version (kDiskTierFormatVersion)
//       12     4  reserved, 0
//       16    16  key: lo then hi
//       32     8  metadata length in bytes
//       40     8  payload length in bytes
//       48     8  XXH3-64 of metadata || payload
//       56     8  XXH3-64 of bytes [0, 56) (the header checksum)
//       64        metadata, then payload; the file ends exactly there
//
// Files are created 0600 and directories 0700: entries hold every tenant's
// cached prompts, for this user only.
//
// A put writes `<hex key>.tmp-<pid>-<sequence>`, fsyncs it, renames it over
// the entry's name (atomic: a reader sees the old file or the new one, never a
// part) and fsyncs the directory. A crash leaves at most a temp file, which the
// next Open removes, so a torn write is only ever a miss. Every read verifies
// the header, the file's length and the body checksum before it returns bytes.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/keys.h"

namespace hybridserve::cachestore {

inline constexpr uint32_t kDiskTierFormatVersion = 1;
// Bytes of the header in front of every entry file; charged to the budget.
inline constexpr uint64_t kDiskTierHeaderBytes = 64;

// One entry read back from disk, verified.
struct DiskTierEntry {
  std::string metadata;
  std::string payload;
};

// Counters since Open. `bytes` are whole files (header included), the unit the
// budget is in.
struct DiskTierStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t hits = 0;
  // Gets that returned NOT_FOUND: no such entry, or its file failed
  // verification (then counted in corrupt_files too).
  int64_t misses = 0;
  // Entry files found unusable, at Open or by a Get, and removed: torn
  // (wrong length), bad magic, header or body checksum mismatch, a key that
  // is not the file's name, an unknown format version, or a file gone.
  int64_t corrupt_files = 0;
  // Entries removed to keep the budget (at Open or by a Put); not Erase.
  int64_t evictions = 0;
  // Temp files of unfinished puts (a crash) that Open removed.
  int64_t temp_files_removed = 0;
  // Files and folders of other names that Open left alone.
  int64_t ignored_files = 0;
};

// Thread-safe. Owns the directory while open: an exclusive flock on
// `<dir>/LOCK` refuses a second DiskTier (in this or another process), which
// is also why Open may remove temp files as a crash's leftovers.
//
// Eviction is LRU over Put and Get (Contains does not count as a use): the
// same policy family as the memory tier's default `--eviction=lru`. Recency
// survives a restart as the files' mtimes: every Put and Get stamps its file
// with a strictly increasing time (best effort: the stamp is not fsynced), and
// Open orders the entries by it.
//
// One absl::Mutex guards the index. Data writes, fsyncs and reads run outside
// it; the lock is held over the metadata operations that must match the index
// (open of the entry to read, rename into place, unlink, the mtime stamp), so
// the index and the directory never disagree about which file a key has.
class DiskTier {
 public:
  // Opens `directory`, creating it (and its parents) if needed, and rebuilds
  // the index from the entry files there: every complete file whose header
  // checks (magic, header checksum, version, key, length) is an entry; temp
  // files are removed; files that fail are removed and counted
  // (corrupt_files). Then evicts the least recently used entries until the
  // bytes fit `byte_budget`. Reads each file's header (and its metadata for
  // `visit`), not its body: a body that fails its checksum is found, removed
  // and a miss at its first Get.
  // INVALID_ARGUMENT for an empty path, a zero budget, or a path that exists
  // and is not a directory; FAILED_PRECONDITION for a directory that cannot
  // be created or written, or that another DiskTier holds.
  //
  // `visit`, when set, is called once for every entry indexed after the
  // rebuild (after the budget's evictions), least recently used first, with
  // its key and metadata, before Open returns: a user rebuilds its own index
  // of the entries from it without reading the files again.
  using EntryVisitor = std::function<void(const Hash128& key, absl::string_view metadata)>;
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const std::string& directory, uint64_t byte_budget,
                                                        const EntryVisitor& visit = nullptr);

  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Stores the entry under `key`, replacing one already there atomically,
  // durable (file and directory fsynced) when it returns OK. Evicts least
  // recently used entries until it fits. RESOURCE_EXHAUSTED, with nothing
  // written, if the entry's file (kDiskTierHeaderBytes + metadata + payload)
  // is larger than the whole budget; INTERNAL naming the call for an I/O
  // error, the old entry (if any) then unchanged unless the rename failed.
  // The budget bounds committed entries: each Put in flight also holds its
  // temp file until it commits. `evicted`, when not null, receives the keys
  // this Put evicted to make room (not `key`'s own replaced file).
  absl::Status Put(const Hash128& key, absl::string_view metadata, absl::string_view payload,
                   std::vector<Hash128>* evicted = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // The entry under `key`, read and verified. NOT_FOUND for no entry, and for
  // a file that fails verification, which is removed (corrupt_files).
  absl::StatusOr<DiskTierEntry> Get(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the index holds `key`; reads no file and is not a use.
  bool Contains(const Hash128& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes `key` the most recently used entry, in the index and in its file's
  // recency stamp (so a later Open orders it the same), without reading it;
  // false if there is no such entry.
  bool Touch(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the entry under `key` (durably); false if there was none.
  bool Erase(const Hash128& key) ABSL_LOCKS_EXCLUDED(mu_);

  DiskTierStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& directory() const { return directory_; }
  uint64_t byte_budget() const { return byte_budget_; }

 private:
  struct IndexEntry {
    uint64_t file_bytes = 0;
    // Bumped by every Put of the key: tells a Get whose file failed
    // verification whether the file at the path is still the one it read.
    uint64_t generation = 0;
    std::list<Hash128>::iterator lru_position;
  };

  DiskTier(std::string directory, uint64_t byte_budget, int dir_fd, int lock_fd);

  absl::Status Rebuild(const EntryVisitor& visit) ABSL_LOCKS_EXCLUDED(mu_);
  std::string EntryPath(const Hash128& key) const;
  // Removes `key` from the index and its file from the directory.
  void RemoveLocked(const Hash128& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts from the LRU end until `incoming` more bytes fit the budget;
  // appends the keys to `evicted` when not null.
  void EvictForLocked(uint64_t incoming, std::vector<Hash128>* evicted = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `fd`'s mtime to the next recency stamp (strictly increasing).
  void StampLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next recency stamp as utimensat/futimens times (atime left alone).
  void NextStampLocked(struct timespec times[2]) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncDirectory() const;

  const std::string directory_;
  const uint64_t byte_budget_;
  const int dir_fd_;   // Owned; the directory, for fsync.
  const int lock_fd_;  // Owned; holds the flock.
  const pid_t pid_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<Hash128, IndexEntry> index_ ABSL_GUARDED_BY(mu_);
  // Most recently used first.
  std::list<Hash128> lru_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_temp_ ABSL_GUARDED_BY(mu_) = 0;
  // The last recency stamp, nanoseconds since the Unix epoch.
  int64_t last_stamp_ns_ ABSL_GUARDED_BY(mu_) = 0;
  DiskTierStats counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_DISK_TIER_H_
