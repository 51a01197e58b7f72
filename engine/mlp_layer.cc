#include "engine/mlp_layer.h"

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"

namespace hybridserve::engine {
namespace {

constexpr WorkspaceBuffer kUp = kScratch0;  // [n, intermediate]

class MlpLayerRunner final : public LayerRunner {
 public:
  MlpLayerRunner(const ModelConfig& config, const DeviceMlpWeights& w, const LayerEnv& env)
      : config_(config), p_(config.mlp), w_(w), env_(env) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    return Run(seg.n_tokens, normed, residual);
  }
  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    return Run(batch.batch, normed, residual);
  }

 private:
  absl::Status Run(int64_t n, const float* normed, float* residual) {
    ASSIGN_OR_RETURN(float* up, env_.workspace->Get<float>(kUp, n * p_.intermediate_size));
    RETURN_IF_ERROR(Linear(env_, normed, n, config_.hidden_size, w_.up_proj, p_.intermediate_size, w_.up_proj_bias, up,
                           /*accumulate=*/false, "mlp up_proj"));
    kernels::ActivationParams act;
    act.x = up;
    act.out = up;
    act.n_rows = n;
    act.dim = p_.intermediate_size;
    act.kind = kernels::ActivationKind::kReluSquared;  // the only MlpActivation of this version
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Activation(act), "Activation(relu2)"));
    return LinearToResidual(env_, up, n, p_.intermediate_size, w_.down_proj, config_.hidden_size, w_.down_proj_bias,
                            residual, "mlp down_proj");
  }

  const ModelConfig& config_;
  const MlpParams& p_;
  const DeviceMlpWeights& w_;
  const LayerEnv env_;
};

}  // namespace

std::unique_ptr<LayerRunner> NewMlpLayerRunner(const ModelConfig& config, const DeviceMlpWeights& weights,
                                               const LayerEnv& env) {
  return std::make_unique<MlpLayerRunner>(config, weights, env);
}

}  // namespace hybridserve::engine
