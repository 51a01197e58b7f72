#include "engine/kv_page_pool.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hybridserve::engine {
namespace {

constexpr int64_t kMaxFloatsPerLayer = int64_t{1} << 40;

}  // namespace

absl::StatusOr<std::unique_ptr<KvPagePool>> KvPagePool::Create(const KvPagePoolOptions& options,
                                                               kernels::Backend& backend) {
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
  kernels::DeviceBuffer storage;
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
    const int64_t bytes = options.num_layers * 2 * options.num_pages * options.page_size * options.n_kv_heads *
                          options.head_dim * static_cast<int64_t>(sizeof(float));
    const int status = backend.Allocate(bytes, &storage);
    if (status != kernels::kKernelOk) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV page pool: the ", backend.name(), " backend cannot allocate ", bytes, " bytes for ",
                       options.num_pages, " pages (", kernels::KernelStatusName(status), ")"));
    }
  }
  return std::unique_ptr<KvPagePool>(new KvPagePool(options, std::move(storage)));
}

KvPagePool::KvPagePool(const KvPagePoolOptions& options, kernels::DeviceBuffer storage)
    : options_(options), storage_(std::move(storage)), refcount_(static_cast<size_t>(options.num_pages), 0) {
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
  for (int32_t p : pages) refcount_[static_cast<size_t>(p)] = 1;
  return pages;
}

absl::Status KvPagePool::CheckHeld(absl::Span<const int32_t> pages, const char* verb) {
  absl::flat_hash_set<int32_t> seen;
  seen.reserve(pages.size());
  for (int32_t p : pages) {
    if (!IsAllocated(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV page pool: page ", p, " is not allocated (", num_pages(), " pages); nothing ", verb));
    }
    if (!seen.insert(p).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV page pool: page ", p, " listed twice (", num_pages(), " pages); nothing ", verb));
    }
  }
  return absl::OkStatus();
}

absl::Status KvPagePool::Retain(absl::Span<const int32_t> pages) {
  if (absl::Status s = CheckHeld(pages, "retained"); !s.ok()) return s;
  for (int32_t p : pages) ++refcount_[static_cast<size_t>(p)];
  return absl::OkStatus();
}

absl::Status KvPagePool::Free(absl::Span<const int32_t> pages) {
  if (absl::Status s = CheckHeld(pages, "freed"); !s.ok()) return s;
  // Pushed in reverse so that the next Allocate hands them out in `pages` order.
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    if (--refcount_[static_cast<size_t>(*it)] == 0) free_.push_back(*it);
  }
  return absl::OkStatus();
}

bool KvPagePool::IsAllocated(int32_t page) const { return refcount(page) > 0; }

int32_t KvPagePool::refcount(int32_t page) const {
  return page >= 0 && page < num_pages() ? refcount_[static_cast<size_t>(page)] : 0;
}

kernels::PagedKvCache KvPagePool::cache(int64_t layer) {
  kernels::PagedKvCache c;
  c.k = k_page(layer, 0);
  c.v = v_page(layer, 0);
  c.num_pages = options_.num_pages;
  c.page_size = options_.page_size;
  c.n_kv_heads = options_.n_kv_heads;
  c.head_dim = options_.head_dim;
  return c;
}

}  // namespace hybridserve::engine
