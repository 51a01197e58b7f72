#ifndef HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_
#define HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_

// The KV pages of every attention layer of one model instance.
//
// A page id names the same physical page in every attention layer: page p of
// layer l holds K and V of `page_size` consecutive tokens of one sequence,
// each [page_size, n_kv_heads, head_dim] fp32, inside the per-layer pools
// [num_pages, page_size, n_kv_heads, head_dim] that the paged attention
// kernels read (kernels/attention_params.h). Pages are allocated and freed
// as a unit across layers.
//
// Not thread-safe: single-threaded, owned by the engine (Model), which
// serializes every call.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_params.h"

namespace hybridserve::engine {

struct KvPagePoolOptions {
  int64_t num_layers = 0;  // attention layers (0: a pool without storage)
  int64_t num_pages = 0;   // capacity, >= 1 and < 2^31
  int64_t page_size = 0;   // tokens per page, >= 1
  int64_t n_kv_heads = 0;  // >= 1 when num_layers > 0
  int64_t head_dim = 0;    // >= 1 when num_layers > 0
};

class KvPagePool {
 public:
  // INVALID_ARGUMENT for a non-positive size or a pool above 2^40 floats per layer.
  // Page contents start as zeros.
  static absl::StatusOr<std::unique_ptr<KvPagePool>> Create(const KvPagePoolOptions& options);

  KvPagePool(const KvPagePool&) = delete;
  KvPagePool& operator=(const KvPagePool&) = delete;

  // n free pages (the most recently freed first; initially the lowest ids), in
  // the order they are returned; all or nothing. RESOURCE_EXHAUSTED (saying
  // how many were asked, free and in all) when fewer than n are free;
  // INVALID_ARGUMENT for n < 0. Contents are whatever the pages held before.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Returns pages to the pool; all or nothing: INVALID_ARGUMENT, and nothing
  // freed, if an id is out of range, not allocated, or repeated.
  absl::Status Free(absl::Span<const int32_t> pages);

  int64_t num_layers() const { return options_.num_layers; }
  int64_t num_pages() const { return options_.num_pages; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t page_size() const { return options_.page_size; }
  bool IsAllocated(int32_t page) const;

  // Floats of one token's K (or V) in one layer: n_kv_heads * head_dim.
  int64_t token_floats() const { return options_.n_kv_heads * options_.head_dim; }
  // Floats of one page's K (or V) in one layer: page_size * token_floats().
  int64_t page_floats() const { return options_.page_size * token_floats(); }

  // The kernels' view of layer `layer`'s pools. Precondition: layer < num_layers().
  kernels::PagedKvCache cache(int64_t layer);
  // K / V of page `page` in layer `layer`: [page_size, n_kv_heads, head_dim].
  float* k_page(int64_t layer, int32_t page) { return k_[layer].data() + page * page_floats(); }
  float* v_page(int64_t layer, int32_t page) { return v_[layer].data() + page * page_floats(); }
  const float* k_page(int64_t layer, int32_t page) const { return k_[layer].data() + page * page_floats(); }
  const float* v_page(int64_t layer, int32_t page) const { return v_[layer].data() + page * page_floats(); }

 private:
  explicit KvPagePool(const KvPagePoolOptions& options);

  KvPagePoolOptions options_;
  std::vector<std::vector<float>> k_;  // [num_layers][num_pages * page_floats]
  std::vector<std::vector<float>> v_;
  std::vector<int32_t> free_;    // free ids, a stack: Allocate pops from the back, Free pushes
  std::vector<bool> allocated_;  // [num_pages]
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_
