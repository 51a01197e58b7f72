#ifndef HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_
#define HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_

// Causal grouped-query attention without biases (transformers'
// NemotronHAttention, BambaAttention, GraniteMoeHybridAttention, eager): q, k, v
// projections; RoPE (rotate-half, on the first rotary_dim dims of each q and k
// head) when the config has it; K/V appended to the sequence's KV pages (keys
// stored rotated); softmax(q k^T * scale) v over keys [0, position], scale
// head_dim^-0.5 unless the config states one; o projection.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// Low-rank adapters on the q, k and v projections (Zamba2's per-use adapters):
// qkv[:, part] += up_part(down_part(x)), in that order after the projection.
struct QkvAdapters {
  DeviceMatrix down;              // [3 * rank, input width]: q's, k's and v's down projections stacked
  DeviceMatrix q_up, k_up, v_up;  // [q_dim | kv_dim | kv_dim, rank]
  int64_t rank = 0;
};

struct AttentionRunnerOptions {
  int64_t input_dim = 0;                  // the input's width; 0: hidden_size
  const QkvAdapters* adapters = nullptr;  // null: none; must outlive the runner
};

// The runner of an attention layer whose KV is layer `kv_layer` of
// env.kv_pages. Copies the q/k/v projections into one fused matrix; `config`
// and `weights` must outlive the runner. The output projection is added to the
// `residual` argument of Prefill/Decode (to a zeroed buffer, it is the output).
absl::StatusOr<std::unique_ptr<LayerRunner>> NewAttentionLayerRunner(const ModelConfig& config,
                                                                     const DeviceAttentionWeights& weights,
                                                                     int64_t kv_layer, const LayerEnv& env,
                                                                     const AttentionRunnerOptions& options = {});

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_ATTENTION_LAYER_H_
