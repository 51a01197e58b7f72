#ifndef HYBRIDSERVE_CACHESTORE_INDEX_SHM_SLAB_ALLOCATOR_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_SHM_SLAB_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachestore/types.h"

namespace hybridserve::cachestore {

// Entry buffers in shared memory (BlobStorage::kSharedMemory), so that the
// shared-memory read path sends a descriptor and an offset instead of a copy
// (docs/ARCHITECTURE.md section 4, "Reads by shared memory").
//
// A slab is a memfd, mapped read-write and MAP_SHARED once in this process,
// cut into slots of one stride: the blob's size rounded up to
// kShmSlotAlignment. A slab holds max(1, kShmSlabTargetBytes / stride) slots,
// so a blob of kShmSlabTargetBytes or more is a slab of its own. Slabs rather
// than a memfd per blob: one mapping per 64 KiB page would reach
// vm.max_map_count (65530) and one descriptor each would be 65K descriptors at
// 4 GiB of pages; with slabs, 4 GiB of pages is 2048 slabs.
//
// Each slab keeps its read-write descriptor and a read-only one, reopened
// through /proc/self/fd with O_RDONLY: the read-only one is what readers get
// (Blob::shm_fd). Through it a reader can neither write (pwrite, a writable
// shared mapping, ftruncate and fallocate all need a descriptor opened for
// writing) nor resize the slab (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
// added at creation; a mapping of it can never SIGBUS). The memfd's mode is
// set to 0400 after the reopen, so a reader of another uid cannot reopen its
// descriptor for writing either; one of the cachestore's own uid could chmod
// it back (it owns the inode), and root ignores the mode: the allowed uids are
// trusted, and every read path verifies checksums whatever a writer did.
//
// A freed slot's memory goes back to the system at once (fallocate
// FALLOC_FL_PUNCH_HOLE): the process's resident size follows the cache's
// contents. A slab whose last slot is freed is unmapped and closed (a reader
// still holding its descriptor keeps the file, not its slots' contents).
//
// Thread-safe. Blobs hold the allocator (shared), so they may outlive every
// other owner.
class ShmSlabAllocator : public std::enable_shared_from_this<ShmSlabAllocator> {
 public:
  static constexpr size_t kShmSlotAlignment = size_t{4} << 10;
  static constexpr size_t kShmSlabTargetBytes = size_t{2} << 20;

  // Whether this process can create slabs: memfd_create with sealing, and
  // the reopen through /proc/self/fd. FAILED_PRECONDITION saying which is
  // missing. Then raises RLIMIT_NOFILE's soft limit to the hard one (two
  // descriptors a slab) and logs it.
  static absl::Status PrepareProcess();

  static std::shared_ptr<ShmSlabAllocator> Create();

  // A blob of exactly `size` bytes in a slot (contents unspecified): data,
  // size, shm_fd and shm_offset set; the slot is freed when the blob is
  // deleted. RESOURCE_EXHAUSTED when the system refuses memory, a mapping or
  // a descriptor.
  absl::StatusOr<std::unique_ptr<Blob>> Allocate(size_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // The stride of a blob of `size` bytes, and the slots a slab of it holds.
  static size_t StrideOf(size_t size);
  static size_t SlotsPerSlab(size_t stride);

  struct Counts {
    int64_t slabs = 0;
    int64_t slots_in_use = 0;
    int64_t mapped_bytes = 0;  // the slabs' sizes (resident: only slots in use)
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

  ~ShmSlabAllocator();

 private:
  struct Slab;
  class SlotRelease;

  ShmSlabAllocator() = default;
  // A new slab of `stride` (mu_ held: the maps change).
  absl::StatusOr<Slab*> NewSlab(size_t stride) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives slot `slot` of `slab` back; its memory was released already.
  void Free(Slab* slab, uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<Slab*, std::unique_ptr<Slab>> slabs_ ABSL_GUARDED_BY(mu_);
  // By stride, the slabs with a free slot (Slab::room_index: the position).
  absl::flat_hash_map<size_t, std::vector<Slab*>> with_room_ ABSL_GUARDED_BY(mu_);
  int64_t slots_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_SHM_SLAB_ALLOCATOR_H_
