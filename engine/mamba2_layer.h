#ifndef HYBRIDSERVE_ENGINE_MAMBA2_LAYER_H_
#define HYBRIDSERVE_ENGINE_MAMBA2_LAYER_H_

// The Mamba2 mixer (transformers' NemotronHMamba2Mixer / Mamba2Mixer, torch path):
//   [z | xBC | dt_raw] = in_proj(x)
//   xBC = silu(causal_conv1d(xBC))                     conv state carried per sequence
//   dt  = clamp(softplus(dt_raw + dt_bias))            prefill_dt_clamp / decode_dt_clamp
//   y   = SSD(x, dt, A = -exp(A_log), B, C) + D * x    SSM state carried per sequence
//   out = out_proj(gated_rmsnorm(y * silu(z)))         groups of norm_group_size channels
// Prefill runs the chunk scan on the absolute chunk grid; decode runs the
// one-step conv update and selective state update.

#include <cstdint>
#include <memory>

#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// The runner of a Mamba2 layer whose states are layer `state_layer` of
// env.state_slots. `config` and `weights` must outlive the runner.
std::unique_ptr<LayerRunner> NewMamba2LayerRunner(const ModelConfig& config, const DeviceMamba2Weights& weights,
                                                  int64_t state_layer, const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MAMBA2_LAYER_H_
