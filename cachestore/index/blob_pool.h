#ifndef HYBRIDSERVE_CACHESTORE_INDEX_BLOB_POOL_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_BLOB_POOL_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/index/shm_slab_allocator.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// Entry buffers: allocation, and recycling by exact size.
//
// Allocation (BlobStorage::kHeap): buffers of kBlobMapThresholdBytes or more
// are their own anonymous mappings, so freeing one gives its memory back to
// the system at once (the process's resident size follows the cache's
// contents instead of keeping a heap's high-water mark); smaller ones come
// from malloc. With BlobStorage::kSharedMemory every buffer is a slot of a
// memfd slab (ShmSlabAllocator: the same promise, the slot's memory released
// when it is freed). A size the system cannot provide is RESOURCE_EXHAUSTED,
// never an exception.
//
// Recycling: entries of one model come in few sizes (every SSM snapshot of a
// model has the same size, every page too), so in a full cache the buffer an
// eviction frees is the one the next put needs, and reusing it skips the page
// faults of fresh memory (for 64 MiB, more than the time of the transfer
// itself). Free buffers are held up to `max_free_bytes` in total, outside the
// cache budgets; past it, the least recently freed go first, so sizes that
// stop coming age out. Thread-safe; buffers may be returned from any thread,
// and may outlive the pool.
class BlobPool : public std::enable_shared_from_this<BlobPool> {
 public:
  // kSharedMemory needs ShmSlabAllocator::PrepareProcess to have succeeded.
  static std::shared_ptr<BlobPool> Create(int64_t max_free_bytes, BlobStorage storage = BlobStorage::kHeap);

  // A buffer of exactly `size` bytes (contents unspecified). When the last
  // reference goes, it returns to the pool if there is room, else it is freed.
  // RESOURCE_EXHAUSTED when the system has no memory for it.
  absl::StatusOr<std::shared_ptr<Blob>> Acquire(size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t free_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  BlobStorage storage() const { return slabs_ != nullptr ? BlobStorage::kSharedMemory : BlobStorage::kHeap; }
  // The slabs' counts (kSharedMemory); zeros for kHeap.
  ShmSlabAllocator::Counts slab_counts() const;

 private:
  BlobPool(int64_t max_free_bytes, std::shared_ptr<ShmSlabAllocator> slabs)
      : max_free_bytes_(max_free_bytes), slabs_(std::move(slabs)) {}
  void Return(Blob* blob) ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_free_bytes_;
  const std::shared_ptr<ShmSlabAllocator> slabs_;  // null for kHeap
  mutable absl::Mutex mu_;
  // Free buffers, least recently freed first; by size, their positions in it.
  std::list<std::unique_ptr<Blob>> free_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<size_t, std::vector<std::list<std::unique_ptr<Blob>>::iterator>> free_by_size_
      ABSL_GUARDED_BY(mu_);
  int64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_BLOB_POOL_H_
