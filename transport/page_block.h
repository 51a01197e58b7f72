#ifndef HYBRIDSERVE_TRANSPORT_PAGE_BLOCK_H_
#define HYBRIDSERVE_TRANSPORT_PAGE_BLOCK_H_

// Where a receiver puts the pages of one transfer: one allocation, page i at
// i * page_bytes, never zero-filled (the receiver writes every page before it
// hands the block out), and, when taken from a PageBlockRecycler, memory that
// earlier transfers already faulted in.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace hybridserve::transport {

class PageBlockRecycler;

// Returns a block's bytes to the recycler it came from (if it still exists),
// else frees them.
struct PageBlockDeleter {
  std::weak_ptr<PageBlockRecycler> home;
  size_t bytes = 0;
  void operator()(char* p) const;
};

// The pages of one transfer. Move-only value type.
class PageBlock {
 public:
  PageBlock() = default;
  // A fresh allocation (not recycled). Callers bound the sizes first (the
  // ticket, TransferRegistry::Limits).
  PageBlock(int64_t num_pages, int64_t page_bytes);

  int64_t size() const { return num_pages_; }
  int64_t page_bytes() const { return page_bytes_; }
  absl::string_view operator[](int64_t i) const {
    return absl::string_view(bytes_.get() + i * page_bytes_, static_cast<size_t>(page_bytes_));
  }
  absl::Span<char> mutable_page(int64_t i) {
    return absl::MakeSpan(bytes_.get() + i * page_bytes_, static_cast<size_t>(page_bytes_));
  }

 private:
  friend class PageBlockRecycler;
  PageBlock(std::unique_ptr<char[], PageBlockDeleter> bytes, int64_t num_pages, int64_t page_bytes)
      : bytes_(std::move(bytes)), num_pages_(num_pages), page_bytes_(page_bytes) {}

  std::unique_ptr<char[], PageBlockDeleter> bytes_;
  int64_t num_pages_ = 0;
  int64_t page_bytes_ = 0;
};

// Keeps the memory of destroyed blocks, up to `max_idle_bytes`, and hands it to
// the next block of the same byte size: a receiver's steady state allocates and
// faults in nothing (a fresh 64 MiB block costs 16K page faults). Thread-safe;
// blocks may outlive it (they then free their bytes).
class PageBlockRecycler : public std::enable_shared_from_this<PageBlockRecycler> {
 public:
  static std::shared_ptr<PageBlockRecycler> Create(int64_t max_idle_bytes);

  PageBlock Take(int64_t num_pages, int64_t page_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t idle_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend struct PageBlockDeleter;
  explicit PageBlockRecycler(int64_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  void Give(char* p, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, std::unique_ptr<char[]>> idle_ ABSL_GUARDED_BY(mu_);
  int64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hybridserve::transport

#endif  // HYBRIDSERVE_TRANSPORT_PAGE_BLOCK_H_
