#include "cachestore/blob_pool.h"

namespace hybridserve::cachestore {

std::shared_ptr<BlobPool> BlobPool::Create(int64_t max_free_bytes) {
  return std::shared_ptr<BlobPool>(new BlobPool(max_free_bytes));
}

std::shared_ptr<Blob> BlobPool::Acquire(size_t size) {
  std::unique_ptr<Blob> blob;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      blob = std::move(it->second.back());
      it->second.pop_back();
      free_bytes_ -= static_cast<int64_t>(size);
    }
  }
  if (blob == nullptr) blob = std::make_unique<Blob>(size);
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
  absl::MutexLock lock(&mu_);
  if (free_bytes_ + static_cast<int64_t>(blob->size) > max_free_bytes_) return;  // freed
  free_bytes_ += static_cast<int64_t>(blob->size);
  free_[blob->size].push_back(std::move(owned));
}

int64_t BlobPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

}  // namespace hybridserve::cachestore
