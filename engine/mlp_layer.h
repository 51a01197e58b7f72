#ifndef HYBRIDSERVE_ENGINE_MLP_LAYER_H_
#define HYBRIDSERVE_ENGINE_MLP_LAYER_H_

// The MLP layer of Nemotron-H: down_proj(relu(up_proj(x))^2), optional biases.
// Stateless: prefill and decode are the same per-row computation.

#include <memory>

#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// `config` and `weights` must outlive the runner.
std::unique_ptr<LayerRunner> NewMlpLayerRunner(const ModelConfig& config, const DeviceMlpWeights& weights,
                                               const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MLP_LAYER_H_
