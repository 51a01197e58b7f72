#ifndef HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_
#define HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_

// The recurrent state of every Mamba2 layer for a fixed number of sequences
// ("slots"), in device memory of the model's backend. A slot id names the
// same row in every layer. Storage is one pool per layer, the layout the
// one-step kernels index by slot (kernels/ssd_params.h,
// kernels/conv1d_params.h):
//   ssm  [num_slots, n_heads, head_dim, d_state]   fp32
//   conv [num_slots, conv_dim, d_conv - 1]         fp32 (oldest input first)
// all inside one device buffer (every layer's ssm pool, then every layer's
// conv pool).
//
// Not thread-safe: single-threaded, owned by the engine's SequenceTable,
// which serializes every call.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace hybridserve::engine {

struct StateSlotPoolOptions {
  int64_t num_layers = 0;  // Mamba2 layers (0: a pool without storage)
  int64_t num_slots = 0;   // capacity, >= 1 and < 2^31
  int64_t n_heads = 0;     // SSM heads; sizes >= 1 when num_layers > 0
  int64_t head_dim = 0;
  int64_t d_state = 0;
  int64_t conv_dim = 0;  // conv channels
  int64_t d_conv = 0;    // conv kernel width; the state keeps d_conv - 1 columns
};

class StateSlotPool {
 public:
  // INVALID_ARGUMENT for a non-positive size or a pool above 2^40 floats per
  // layer; RESOURCE_EXHAUSTED when the backend cannot allocate it. `backend`
  // must outlive the pool.
  static absl::StatusOr<std::unique_ptr<StateSlotPool>> Create(const StateSlotPoolOptions& options,
                                                               kernels::Backend& backend);

  StateSlotPool(const StateSlotPool&) = delete;
  StateSlotPool& operator=(const StateSlotPool&) = delete;

  // A free slot whose states are zeroed (the state of an empty sequence).
  // RESOURCE_EXHAUSTED when every slot is taken.
  absl::StatusOr<int32_t> Allocate();
  // A free slot holding a copy of slot `source`'s states (a fork).
  // RESOURCE_EXHAUSTED when every slot is taken; INVALID_ARGUMENT when
  // `source` is not allocated.
  absl::StatusOr<int32_t> AllocateCopyOf(int32_t source);
  // INVALID_ARGUMENT if `slot` is out of range or not allocated.
  absl::Status Free(int32_t slot);

  int64_t num_layers() const { return options_.num_layers; }
  int64_t num_slots() const { return options_.num_slots; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  bool IsAllocated(int32_t slot) const;

  // Floats of one slot's SSM state (n_heads * head_dim * d_state) and conv
  // state (conv_dim * (d_conv - 1)) in one layer.
  int64_t ssm_floats() const { return options_.n_heads * options_.head_dim * options_.d_state; }
  int64_t conv_floats() const { return options_.conv_dim * (options_.d_conv - 1); }

  // Whole per-layer pools (for the batched one-step kernels), device memory.
  // Precondition: layer < num_layers().
  float* ssm_pool(int64_t layer) { return storage_.as<float>() + layer * num_slots() * ssm_floats(); }
  float* conv_pool(int64_t layer) {
    return storage_.as<float>() + (num_layers() * ssm_floats() + layer * conv_floats()) * num_slots();
  }
  // One slot's state in one layer, device memory.
  float* ssm(int64_t layer, int32_t slot) { return ssm_pool(layer) + slot * ssm_floats(); }
  float* conv(int64_t layer, int32_t slot) { return conv_pool(layer) + slot * conv_floats(); }
  const float* ssm(int64_t layer, int32_t slot) const { return const_cast<StateSlotPool*>(this)->ssm(layer, slot); }
  const float* conv(int64_t layer, int32_t slot) const { return const_cast<StateSlotPool*>(this)->conv(layer, slot); }

  // Every slot of every layer as one device buffer (empty without Mamba2 layers).
  const kernels::DeviceBuffer& storage() const { return storage_; }

 private:
  StateSlotPool(const StateSlotPoolOptions& options, kernels::Backend& backend, kernels::DeviceBuffer storage);
  // Takes a free slot off the stack (precondition: one is free).
  int32_t Take();

  StateSlotPoolOptions options_;
  kernels::Backend& backend_;
  kernels::DeviceBuffer storage_;
  std::vector<int32_t> free_;    // a stack: Allocate pops from the back (initially slot 0)
  std::vector<bool> allocated_;  // [num_slots]
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_
