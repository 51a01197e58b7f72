#include "cachestore/index/blob_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hybridserve::cachestore {

namespace {

// Fresh bytes for a blob; nullptr when the system refuses.
uint8_t* AllocateBytes(size_t size) {
  if (size >= kBlobMapThresholdBytes) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  return static_cast<uint8_t*>(std::malloc(size == 0 ? 1 : size));
}

}  // namespace

std::shared_ptr<BlobPool> BlobPool::Create(int64_t max_free_bytes, BlobStorage storage) {
  return std::shared_ptr<BlobPool>(
      new BlobPool(max_free_bytes, storage == BlobStorage::kSharedMemory ? ShmSlabAllocator::Create() : nullptr));
}

ShmSlabAllocator::Counts BlobPool::slab_counts() const {
  return slabs_ != nullptr ? slabs_->counts() : ShmSlabAllocator::Counts{};
}

absl::StatusOr<std::shared_ptr<Blob>> BlobPool::Acquire(size_t size) {
  std::unique_ptr<Blob> blob;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_by_size_.find(size);
    if (it != free_by_size_.end()) {
      // The most recently freed of this size: its pages are the likeliest resident.
      auto pos = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) free_by_size_.erase(it);
      blob = std::move(*pos);
      free_order_.erase(pos);
      free_bytes_ -= static_cast<int64_t>(size);
    }
  }
  if (blob != nullptr) {
    blob->fresh = false;  // recycled
  } else if (slabs_ != nullptr) {
    absl::StatusOr<std::unique_ptr<Blob>> slot = slabs_->Allocate(size);
    if (!slot.ok()) return slot.status();
    blob = *std::move(slot);
    blob->fresh = true;
  }
  if (blob == nullptr) {
    uint8_t* bytes = AllocateBytes(size);
    if (bytes == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", size, " bytes for the entry: the machine's memory is exhausted"));
    }
    blob = std::make_unique<Blob>();
    blob->data = std::unique_ptr<uint8_t[], BlobBytesDeleter>(bytes, BlobBytesDeleter{size});
    blob->size = size;
  }
  // The deleter holds the pool weakly: a buffer that outlives it is freed.
  std::weak_ptr<BlobPool> pool = weak_from_this();
  return std::shared_ptr<Blob>(blob.release(), [pool](Blob* b) {
    if (std::shared_ptr<BlobPool> p = pool.lock()) {
      p->Return(b);
    } else {
      delete b;
    }
  });
}

void BlobPool::Return(Blob* blob) {
  std::unique_ptr<Blob> owned(blob);
  const int64_t size = static_cast<int64_t>(blob->size);
  std::vector<std::unique_ptr<Blob>> dropped;  // freed after the lock
  {
    absl::MutexLock lock(&mu_);
    if (size > max_free_bytes_) return;  // never fits: freed
    while (free_bytes_ + size > max_free_bytes_) {
      std::unique_ptr<Blob>& oldest = free_order_.front();
      auto& same = free_by_size_[oldest->size];
      // The oldest of its size is the first in its vector.
      same.erase(same.begin());
      if (same.empty()) free_by_size_.erase(oldest->size);
      free_bytes_ -= static_cast<int64_t>(oldest->size);
      dropped.push_back(std::move(oldest));
      free_order_.pop_front();
    }
    free_order_.push_back(std::move(owned));
    free_by_size_[blob->size].push_back(std::prev(free_order_.end()));
    free_bytes_ += size;
  }
}

int64_t BlobPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

}  // namespace hybridserve::cachestore
