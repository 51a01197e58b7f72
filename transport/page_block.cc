#include "transport/page_block.h"

#include <utility>

namespace hybridserve::transport {

void PageBlockDeleter::operator()(char* p) const {
  if (p == nullptr) return;
  if (std::shared_ptr<PageBlockRecycler> recycler = home.lock()) {
    recycler->Give(p, bytes);
  } else {
    delete[] p;
  }
}

PageBlock::PageBlock(int64_t num_pages, int64_t page_bytes) : num_pages_(num_pages), page_bytes_(page_bytes) {
  const size_t bytes = num_pages > 0 && page_bytes > 0 ? static_cast<size_t>(num_pages * page_bytes) : 0;
  if (bytes > 0) bytes_ = std::unique_ptr<char[], PageBlockDeleter>(new char[bytes], PageBlockDeleter{{}, bytes});
}

std::shared_ptr<PageBlockRecycler> PageBlockRecycler::Create(int64_t max_idle_bytes) {
  return std::shared_ptr<PageBlockRecycler>(new PageBlockRecycler(max_idle_bytes));
}

PageBlock PageBlockRecycler::Take(int64_t num_pages, int64_t page_bytes) {
  const size_t bytes = num_pages > 0 && page_bytes > 0 ? static_cast<size_t>(num_pages * page_bytes) : 0;
  if (bytes == 0) return PageBlock(num_pages, page_bytes);
  std::unique_ptr<char[]> reused;
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(bytes);
    if (it != idle_.end()) {
      reused = std::move(it->second);
      idle_.erase(it);
      idle_bytes_ -= static_cast<int64_t>(bytes);
    }
  }
  char* p = reused != nullptr ? reused.release() : new char[bytes];
  return PageBlock(std::unique_ptr<char[], PageBlockDeleter>(p, PageBlockDeleter{weak_from_this(), bytes}), num_pages,
                   page_bytes);
}

int64_t PageBlockRecycler::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

void PageBlockRecycler::Give(char* p, size_t bytes) {
  std::unique_ptr<char[]> owned(p);
  absl::MutexLock lock(&mu_);
  // Kept only while the idle memory stays within its bound.
  if (idle_bytes_ + static_cast<int64_t>(bytes) > max_idle_bytes_) return;  // freed by `owned`
  idle_bytes_ += static_cast<int64_t>(bytes);
  idle_.emplace(bytes, std::move(owned));
}

}  // namespace hybridserve::transport
