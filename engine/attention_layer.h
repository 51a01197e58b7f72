#ifndef HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_
#define HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_

// Causal grouped-query attention without position encoding and without biases
// (transformers' NemotronHAttention, eager): q, k, v projections, K/V appended
// to the sequence's KV pages, softmax(q k^T * head_dim^-0.5) v over keys
// [0, position], o projection.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// The runner of an attention layer whose KV is layer `kv_layer` of
// env.kv_pages. Copies the q/k/v projections into one fused matrix; `config`
// and `weights` must outlive the runner. UNIMPLEMENTED for RoPE (no family of
// this version uses it in attention layers).
absl::StatusOr<std::unique_ptr<LayerRunner>> NewAttentionLayerRunner(const ModelConfig& config,
                                                                     const DeviceAttentionWeights& weights,
                                                                     int64_t kv_layer, const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_
