#ifndef HYBRIDSERVE_ENGINE_PARALLEL_LAYER_H_
#define HYBRIDSERVE_ENGINE_PARALLEL_LAYER_H_

// Falcon-H1's mixer block: a Mamba2 mixer and attention read the same normed
// input, and the block adds their outputs (each times its out-multiplier) to
// the residual stream as one sum:
//   residual += ssm_out_multiplier * mamba(x) + attention_out_multiplier * attention(x)
// with the sum formed first (mamba's, then attention's term), as transformers
// adds it. The block keeps both kinds of state: the SSM and conv state of
// `state_layer` and the KV pages of `kv_layer`.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// `config` and `weights` must outlive the runner.
absl::StatusOr<std::unique_ptr<LayerRunner>> NewParallelLayerRunner(const ModelConfig& config,
                                                                    const DeviceParallelWeights& weights,
                                                                    int64_t state_layer, int64_t kv_layer,
                                                                    const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_PARALLEL_LAYER_H_
