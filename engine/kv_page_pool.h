#ifndef HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_
#define HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_

// The KV pages of every attention layer of one model instance, in device
// memory of the model's backend, with a reference count per page.
//
// A page id names the same physical page in every attention layer: page p of
// layer l holds K and V of `page_size` consecutive tokens of one sequence,
// each [page_size, n_kv_heads, head_dim] fp32, inside the per-layer pools
// [num_pages, page_size, n_kv_heads, head_dim] that the paged attention
// kernels read (kernels/attention_params.h). The pools are one device buffer:
// layer l's K at l * 2 * layer_bytes, its V right after. Pages are allocated
// and freed as a unit across layers.
//
// Sharing: Allocate hands out pages with one reference; Retain adds one (a
// forked sequence sharing its parent's full pages); Free drops one, and a
// page returns to the pool when its last reference goes. Only full pages are
// shared, and a full page is never written again, so sharing needs no
// copy-on-write.
//
// Not thread-safe: single-threaded, owned by the engine's SequenceTable,
// which serializes every call.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention_params.h"
#include "kernels/backend.h"

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
  // INVALID_ARGUMENT for a non-positive size or a pool above 2^40 floats per
  // layer; RESOURCE_EXHAUSTED when the backend cannot allocate it. Page
  // contents start as zeros. `backend` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<KvPagePool>> Create(const KvPagePoolOptions& options,
                                                            kernels::Backend& backend);

  KvPagePool(const KvPagePool&) = delete;
  KvPagePool& operator=(const KvPagePool&) = delete;

  // n free pages (the most recently freed first; initially the lowest ids), in
  // the order they are returned, each with one reference; all or nothing.
  // RESOURCE_EXHAUSTED (saying how many were asked, free and in all) when
  // fewer than n are free; INVALID_ARGUMENT for n < 0. Contents are whatever
  // the pages held before.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // One more reference to each page; all or nothing: INVALID_ARGUMENT, and
  // nothing retained, if an id is out of range, not allocated, or repeated.
  absl::Status Retain(absl::Span<const int32_t> pages);
  // Drops one reference to each page; a page whose last reference goes
  // returns to the pool. All or nothing: INVALID_ARGUMENT, and nothing
  // changed, if an id is out of range, not allocated, or repeated.
  absl::Status Free(absl::Span<const int32_t> pages);

  int64_t num_layers() const { return options_.num_layers; }
  int64_t num_pages() const { return options_.num_pages; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t page_size() const { return options_.page_size; }
  bool IsAllocated(int32_t page) const;
  // References held on `page` (0 when free or out of range).
  int32_t refcount(int32_t page) const;

  // Floats of one token's K (or V) in one layer: n_kv_heads * head_dim.
  int64_t token_floats() const { return options_.n_kv_heads * options_.head_dim; }
  // Floats of one page's K (or V) in one layer: page_size * token_floats().
  int64_t page_floats() const { return options_.page_size * token_floats(); }

  // The kernels' view of layer `layer`'s pools (device memory). Precondition: layer < num_layers().
  kernels::PagedKvCache cache(int64_t layer);
  // K / V of page `page` in layer `layer`: [page_size, n_kv_heads, head_dim],
  // device memory. Preconditions: layer < num_layers(), page < num_pages().
  float* k_page(int64_t layer, int32_t page) { return layer_k(layer) + page * page_floats(); }
  float* v_page(int64_t layer, int32_t page) { return layer_k(layer) + layer_floats() + page * page_floats(); }
  const float* k_page(int64_t layer, int32_t page) const { return const_cast<KvPagePool*>(this)->k_page(layer, page); }
  const float* v_page(int64_t layer, int32_t page) const { return const_cast<KvPagePool*>(this)->v_page(layer, page); }

  // The whole pool (all layers' K and V) as one device buffer (empty without
  // attention layers): what a device-to-device transport registers once.
  const kernels::DeviceBuffer& storage() const { return storage_; }

 private:
  KvPagePool(const KvPagePoolOptions& options, kernels::DeviceBuffer storage);
  int64_t layer_floats() const { return options_.num_pages * page_floats(); }
  float* layer_k(int64_t layer) { return storage_.as<float>() + layer * 2 * layer_floats(); }
  // OK when every id is allocated and none repeats; `verb` names the operation in the message.
  absl::Status CheckHeld(absl::Span<const int32_t> pages, const char* verb);

  KvPagePoolOptions options_;
  kernels::DeviceBuffer storage_;
  std::vector<int32_t> free_;      // free ids, a stack: Allocate pops from the back, Free pushes
  std::vector<int32_t> refcount_;  // [num_pages]
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_KV_PAGE_POOL_H_
