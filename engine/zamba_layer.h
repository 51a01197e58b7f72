#ifndef HYBRIDSERVE_ENGINE_ZAMBA_LAYER_H_
#define HYBRIDSERVE_ENGINE_ZAMBA_LAYER_H_

// Zamba2's hybrid layer (transformers 5.23 Zamba2HybridLayer), for use u of
// shared block b = u % num_mem_blocks, on the raw residual stream h and the
// model's input embeddings e:
//   x = RMSNorm_2H([h | e])                      shared block's input_layernorm
//   a = o_proj(attention(q, k, v))               q|k|v = W x + adapters_u(x); RoPE
//                                                with use_mem_rope; this use's KV
//   f = RMSNorm_H(a)                             pre_ff_layernorm (no residual)
//   t = down(act(gate) * up)                     gate|up = W f + adapter_u(f)
//   h += mamba(RMSNorm_H(h + linear(t)))         the layer's own Mamba2 and norm
// The shared block's output reaches the residual only through the Mamba2
// layer's input. The block has no pre-norm of the Model's: it reads h itself.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// The layer's SSM state is `state_layer`, its KV pages `kv_layer`. `config`,
// `weights` and `shared` must outlive the runner.
absl::StatusOr<std::unique_ptr<LayerRunner>> NewZambaHybridLayerRunner(const ModelConfig& config,
                                                                       const DeviceZambaHybridWeights& weights,
                                                                       const DeviceZambaSharedBlock& shared,
                                                                       int64_t state_layer, int64_t kv_layer,
                                                                       const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_ZAMBA_LAYER_H_
