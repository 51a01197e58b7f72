#include "engine/kv_page_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::engine {
namespace {

constexpr int64_t kMaxFloatsPerLayer = int64_t{1} << 40;

}  // namespace

absl::StatusOr<std::unique_ptr<KvPagePool>> KvPagePool::Create(const KvPagePoolOptions& options) {
  if (options.num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV page pool: num_layers ", options.num_layers, " < 0"));
  }
  if (options.num_pages < 1 || options.num_pages > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV page pool: num_pages ", options.num_pages, " outside [1, 2^31 - 1]"));
  }
  if (options.page_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV page pool: page_size ", options.page_size, " < 1"));
  }
  if (options.num_layers > 0) {
    if (options.n_kv_heads < 1 || options.head_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat("KV page pool: n_kv_heads ", options.n_kv_heads, " and head_dim ",
                                                     options.head_dim, " must be >= 1"));
    }
    const double floats = static_cast<double>(options.num_pages) * static_cast<double>(options.page_size) *
                          static_cast<double>(options.n_kv_heads) * static_cast<double>(options.head_dim);
    if (floats > static_cast<double>(kMaxFloatsPerLayer)) {
      return absl::InvalidArgumentError(absl::StrCat("KV page pool: ", options.num_pages, " pages of ",
                                                     options.page_size, " x ", options.n_kv_heads, " x ",
                                                     options.head_dim, " floats exceed 2^40 floats per layer"));
    }
  }
  return std::unique_ptr<KvPagePool>(new KvPagePool(options));
}

KvPagePool::KvPagePool(const KvPagePoolOptions& options)
    : options_(options), allocated_(static_cast<size_t>(options.num_pages), false) {
  const size_t layer_floats = static_cast<size_t>(options.num_pages * page_floats());
  k_.assign(static_cast<size_t>(options.num_layers), std::vector<float>(layer_floats, 0.0f));
  v_.assign(static_cast<size_t>(options.num_layers), std::vector<float>(layer_floats, 0.0f));
  free_.reserve(static_cast<size_t>(options.num_pages));
  for (int64_t p = options.num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

absl::StatusOr<std::vector<int32_t>> KvPagePool::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("KV page pool: cannot allocate ", n, " pages"));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of KV pages: need ", n, ", ", num_free(), " free of ",
                                                     num_pages(), " (page_size ", page_size(), " tokens)"));
  }
  std::vector<int32_t> pages(free_.end() - n, free_.end());
  std::reverse(pages.begin(), pages.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  for (int32_t p : pages) allocated_[static_cast<size_t>(p)] = true;
  return pages;
}

absl::Status KvPagePool::Free(absl::Span<const int32_t> pages) {
  // Clear the flags as we go, so a repeated id fails like an unallocated one;
  // on failure restore the flags of the ids already cleared.
  size_t cleared = 0;
  for (; cleared < pages.size(); ++cleared) {
    const int32_t p = pages[cleared];
    if (!IsAllocated(p)) break;
    allocated_[static_cast<size_t>(p)] = false;
  }
  if (cleared < pages.size()) {
    const int32_t bad = pages[cleared];
    const bool repeated = std::find(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(cleared), bad) !=
                          pages.begin() + static_cast<std::ptrdiff_t>(cleared);
    for (size_t i = 0; i < cleared; ++i) allocated_[static_cast<size_t>(pages[i])] = true;
    return absl::InvalidArgumentError(absl::StrCat("KV page pool: page ", bad,
                                                   repeated ? " listed twice" : " is not allocated", " (", num_pages(),
                                                   " pages); nothing freed"));
  }
  free_.insert(free_.end(), pages.rbegin(), pages.rend());
  return absl::OkStatus();
}

bool KvPagePool::IsAllocated(int32_t page) const {
  return page >= 0 && page < num_pages() && allocated_[static_cast<size_t>(page)];
}

kernels::PagedKvCache KvPagePool::cache(int64_t layer) {
  kernels::PagedKvCache c;
  c.k = k_[static_cast<size_t>(layer)].data();
  c.v = v_[static_cast<size_t>(layer)].data();
  c.num_pages = options_.num_pages;
  c.page_size = options_.page_size;
  c.n_kv_heads = options_.n_kv_heads;
  c.head_dim = options_.head_dim;
  return c;
}

}  // namespace hybridserve::engine
