#ifndef HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_
#define HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_

// The recurrent state of every Mamba2 layer for a fixed number of sequences
// ("slots"). A slot id names the same row in every layer. Storage is one
// pool per layer, the layout the one-step kernels index by slot
// (kernels/ssd_params.h, kernels/conv1d_params.h):
//   ssm  [num_slots, n_heads, head_dim, d_state]   fp32
//   conv [num_slots, conv_dim, d_conv - 1]         fp32 (oldest input first)
//
// Not thread-safe: single-threaded, owned by the engine (Model), which
// serializes every call.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
  // INVALID_ARGUMENT for a non-positive size or a pool above 2^40 floats per layer.
  static absl::StatusOr<std::unique_ptr<StateSlotPool>> Create(const StateSlotPoolOptions& options);

  StateSlotPool(const StateSlotPool&) = delete;
  StateSlotPool& operator=(const StateSlotPool&) = delete;

  // A free slot whose states are zeroed (the state of an empty sequence).
  // RESOURCE_EXHAUSTED when every slot is taken.
  absl::StatusOr<int32_t> Allocate();
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

  // Whole per-layer pools (for the batched one-step kernels). Precondition: layer < num_layers().
  float* ssm_pool(int64_t layer) { return ssm_[static_cast<size_t>(layer)].data(); }
  float* conv_pool(int64_t layer) { return conv_[static_cast<size_t>(layer)].data(); }
  // One slot's state in one layer.
  float* ssm(int64_t layer, int32_t slot) { return ssm_pool(layer) + slot * ssm_floats(); }
  float* conv(int64_t layer, int32_t slot) { return conv_pool(layer) + slot * conv_floats(); }
  const float* ssm(int64_t layer, int32_t slot) const {
    return ssm_[static_cast<size_t>(layer)].data() + slot * ssm_floats();
  }
  const float* conv(int64_t layer, int32_t slot) const {
    return conv_[static_cast<size_t>(layer)].data() + slot * conv_floats();
  }

 private:
  explicit StateSlotPool(const StateSlotPoolOptions& options);

  StateSlotPoolOptions options_;
  std::vector<std::vector<float>> ssm_;   // [num_layers][num_slots * ssm_floats]
  std::vector<std::vector<float>> conv_;  // [num_layers][num_slots * conv_floats]
  std::vector<int32_t> free_;             // a stack: Allocate pops from the back (initially slot 0)
  std::vector<bool> allocated_;           // [num_slots]
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_STATE_SLOT_POOL_H_
