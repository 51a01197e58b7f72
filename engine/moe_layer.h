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
// Routing runs on the host: the router logits [rows, experts] are copied back,
// each row's top_k experts and weights chosen (MoeRouter), and the rows grouped
// by expert. Each expert then runs once over its rows (gathered into one
// contiguous block), and its outputs are added, weighted, into y expert by
// expert. Batch invariance: in the deterministic matmul mode a row's product
// does not depend on which other rows share the call, its top-k depends on its
// own logits only, and its sum is taken in ascending expert order whatever the
// batch; so a row's bits are the same alone or in any batch. The copy-back is
// a device synchronisation per block, and it cannot be recorded in a graph (a
// decode graph with an expert block fails to record and runs kernel by kernel).

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
