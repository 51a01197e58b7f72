#ifndef HYBRIDSERVE_BENCH_CACHESTORE_SIMULATED_DISK_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_SIMULATED_DISK_H_

// One cachestore shard's disk tier as cache_sim replays it (cache_sim.h):
// the files cachestore/index/disk_tier.h would hold, by key, in LRU order
// over spills and reads, under a byte budget, without their bytes. Not
// thread-safe.

#include <cstdint>
#include <list>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "cachestore/keys.h"
#include "cachestore/types.h"

namespace hybridserve::bench {

// Counters of a run's disk tier, summed over the shards; CacheSimResult
// carries them (`budget_bytes`, `hits` .. `saved_flops`, `files` and `bytes`
// are RunCacheSim's to fill).
struct CacheSimDisk {
  int64_t budget_bytes = 0;  // all shards together
  // Turns whose resume point came from disk (deeper than memory's), and
  // the tokens and FLOPs that added over the memory hit of those turns.
  int64_t hits = 0;
  int64_t hit_tokens = 0;
  double saved_flops = 0;
  int64_t files_written = 0;  // spills (entries not on disk yet)
  int64_t bytes_written = 0;
  int64_t spills_present = 0;  // evicted entries already on disk: not rewritten
  int64_t spills_refused = 0;  // larger than the budget
  int64_t files_read = 0;      // promotions' reads
  int64_t bytes_read = 0;
  int64_t evictions = 0;           // files removed for the budget
  int64_t promotion_failures = 0;  // promoted entries the memory refused
  int64_t files = 0;               // on disk at the end
  int64_t bytes = 0;
};

class SimulatedDisk {
 public:
  struct File {
    cachestore::EntryClass entry_class = cachestore::EntryClass::kPage;
    // States: the node they hang at (their parent page's key, or the
    // namespace's); the tail is position % page_size tokens.
    cachestore::Hash128 node;
    int64_t position = 0;
    cachestore::StateKind state_kind = cachestore::StateKind::kExactPrefix;
    int64_t bytes = 0;  // the whole file, as the budget counts it
  };

  // `stats` outlives the disk; several disks may count into one.
  SimulatedDisk(int64_t budget_bytes, int32_t page_size, CacheSimDisk& stats)
      : budget_bytes_(budget_bytes), page_size_(page_size), stats_(stats) {}

  // Writes `file` under `key`, the most recently used, after evicting the
  // least recently used files until it fits. Not when the key is there
  // already (spills_present: nothing rewritten, not a use) or the file is
  // larger than the budget (spills_refused).
  void Spill(const cachestore::Hash128& key, const File& file);

  // The file under `key`, null when none; not a use.
  const File* Find(const cachestore::Hash128& key) const;

  // Reads the file under `key`, which must be there: a use (now the most
  // recently used).
  File Read(const cachestore::Hash128& key);

  // The tail lengths of the states on disk at `node`, with their counts
  // (a lookup tries each once, as CacheIndex does); null when none.
  const std::map<int64_t, int>* TailLengths(const cachestore::Hash128& node) const;

  int64_t files() const { return static_cast<int64_t>(files_.size()); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Slot {
    File file;
    std::list<cachestore::Hash128>::iterator lru;
  };

  int64_t TailLength(const File& f) const { return f.position % page_size_; }
  void Remove(const cachestore::Hash128& key);

  const int64_t budget_bytes_;
  const int32_t page_size_;
  CacheSimDisk& stats_;
  std::list<cachestore::Hash128> lru_;  // least recently used first
  absl::flat_hash_map<cachestore::Hash128, Slot> files_;
  absl::flat_hash_map<cachestore::Hash128, std::map<int64_t, int>> tail_lengths_;
  int64_t bytes_ = 0;
};

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_SIMULATED_DISK_H_
