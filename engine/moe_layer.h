#ifndef HYBRIDSERVE_ENGINE_MOE_LAYER_H_
#define HYBRIDSERVE_ENGINE_MOE_LAYER_H_

// The mixture-of-experts block (Granite's block_sparse_moe + shared_mlp,
// Nemotron-H's NemotronHMoE):
//   y = sum over the row's chosen experts e, ascending e, of w_e * expert_e(x)
//       + shared(x)
// then residual += residual_multiplier * y. Experts and the shared expert are
// SwiGLU MLPs (Granite) or relu2 MLPs (Nemotron-H): MoeParams::expert. With
// latent projections (Nemotron-H's moe_latent_size) the routed experts run on
// fc1(x), computed for every row, and their weighted sum, still taken in
// ascending expert order, is projected back before the shared expert's output
// is added, as transformers 5.23's NemotronHMoE does:
//   y = fc2(sum over e of w_e * expert_e(fc1(x))) + shared(x)
// (the router and the shared expert read x). fc1 and fc2 are per-row
// matmuls, so the batch invariance below holds with them too.
//
// Routing runs on the device (kernels/moe_params.h): MoeRoute turns the
// router logits [rows, experts] into each row's top_k experts and weights
// (MoeRouter), the entries grouped by ascending expert with rows ascending
// within an expert, per-expert offsets and each row's slots. The rows are
// gathered into that order, ExpertMatmul runs each expert once over its
// contiguous rows (the shared expert's projection issued in the same call),
// and MoeCombine adds each row's weighted expert outputs in ascending expert
// order. The row counts never leave the device, so nothing in the block waits
// for the host and a decode step with expert blocks records as a graph like
// any other. Batch invariance: in the deterministic matmul mode a row's
// product does not depend on which other rows share the call, its top-k
// depends on its own logits only, and its sum is taken in ascending expert
// order whatever the batch; so a row's bits are the same alone or in any
// batch. A prefill longer than kMaxMoeRouteEntries / top_k rows is routed and
// run in pieces of that many rows (rows are independent).

#include <memory>

#include "engine/device_weights.h"
#include "engine/layer_runner.h"
#include "engine/model_config.h"

namespace hybridserve::engine {

// `config` and `weights` must outlive the runner.
std::unique_ptr<LayerRunner> NewMoeLayerRunner(const ModelConfig& config, const DeviceMoeWeights& weights,
                                               const LayerEnv& env);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_MOE_LAYER_H_
