#ifndef HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_
#define HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_

// The gated (SwiGLU) MLP block of Bamba, Granite and Falcon-H1:
// down(silu(gate(x) * gate_multiplier) * up(x)) * down_multiplier, gate and up
// as one [2 * intermediate, hidden] projection (multipliers 1 but in Falcon-H1). Stateless: prefill and decode are the
// same per-row computation.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// `config` and `weights` must outlive the runner.
std::unique_ptr<LayerRunner> NewGatedMlpLayerRunner(const ModelConfig& config, const DeviceGatedMlpWeights& weights,
                                                    const LayerEnv& env);

// y[n, hidden] = down(silu(gate(x)) * up(x)) for x [n, hidden], added to y
// (y + down(...)) when `accumulate`. Uses `scratch` for the [n, 2 * intermediate]
// projection. The gate is multiplied by gate_multiplier before silu (Falcon-H1).
absl::Status GatedMlp(const LayerEnv& env, const DeviceGatedMlpWeights& w, const float* x, int64_t n, int64_t hidden,
                      int64_t intermediate, WorkspaceBuffer scratch, float* y, bool accumulate,
                      float gate_multiplier = 1.0f);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_
