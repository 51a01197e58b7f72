#ifndef HYBRIDSERVE_CACHESTORE_BLOB_POOL_H_
#define HYBRIDSERVE_CACHESTORE_BLOB_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// Recycles entry buffers by exact size. Entries of one model come in few sizes
// (every SSM snapshot of a model has the same size, every page too), so in a
// full cache the buffer an eviction frees is the one the next put needs, and
// reusing it skips the page faults of fresh memory (for 64 MiB, more than the
// time of the transfer itself). Free buffers are held up to `max_free_bytes`
// in total, outside the cache budgets. Thread-safe; buffers may be returned
// from any thread, and may outlive the pool.
class BlobPool : public std::enable_shared_from_this<BlobPool> {
 public:
  static std::shared_ptr<BlobPool> Create(int64_t max_free_bytes);

  // A buffer of exactly `size` bytes (contents unspecified). When the last
  // reference goes, it returns to the pool if there is room, else it is freed.
  std::shared_ptr<Blob> Acquire(size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t free_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit BlobPool(int64_t max_free_bytes) : max_free_bytes_(max_free_bytes) {}
  void Return(Blob* blob) ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_free_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<Blob>>> free_ ABSL_GUARDED_BY(mu_);
  int64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_BLOB_POOL_H_
