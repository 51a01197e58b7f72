#ifndef HYBRIDSERVE_ENGINE_GATED_DELTANET_LAYER_H_
#define HYBRIDSERVE_ENGINE_GATED_DELTANET_LAYER_H_

// The Gated DeltaNet mixer (transformers' Qwen3NextGatedDeltaNet /
// Qwen3_5GatedDeltaNet, torch path; GatedDeltaNetParams in model_config.h):
//   [q | k | v | z | b | a] = in_proj(x)
//   qkv  = silu(causal_conv1d(q | k | v))             conv state carried per sequence
//   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
//   o    = gated delta rule(l2norm(q), l2norm(k), v, g, beta)   state carried per sequence
//   out  = out_proj(rmsnorm(o per value head) * norm * silu(z))
// Prefill runs the chunked rule on the absolute chunk grid (the chunk
// boundaries are exact restore points); decode runs the one-token conv update
// and the recurrent step. Its states are the recurrent layer `state_layer` of
// env.state_slots: the ssm array holds the [v_heads, k_head_dim, v_head_dim]
// delta-rule state, the conv array the [conv_dim, conv_kernel - 1] conv state.

#include <cstdint>
#include <memory>

#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// `config` and `weights` must outlive the runner.
std::unique_ptr<LayerRunner> NewGatedDeltaNetLayerRunner(const ModelConfig& config,
                                                         const DeviceGatedDeltaNetWeights& weights, int64_t state_layer,
                                                         const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_GATED_DELTANET_LAYER_H_
