#ifndef HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_
#define HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_

// The gated (SwiGLU) MLP block of Bamba and Granite:
// down(silu(gate(x)) * up(x)), gate and up as one [2 * intermediate, hidden]
// projection. Stateless: prefill and decode are the same per-row computation.

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
// projection.
absl::Status GatedMlp(const LayerEnv& env, const DeviceGatedMlpWeights& w, const float* x, int64_t n, int64_t hidden,
                      int64_t intermediate, WorkspaceBuffer scratch, float* y, bool accumulate);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_GATED_MLP_LAYER_H_
