#include "engine/gated_mlp_layer.h"

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"

namespace hybridserve::engine {
namespace {

// The [n, 2 * intermediate] gate|up projection, then silu(gate) * up in place
// over its first half. Returns the activations ([n, intermediate], row stride
// 2 * intermediate).
absl::StatusOr<float*> GateUp(const LayerEnv& env, const DeviceGatedMlpWeights& w, const float* x, int64_t n,
                              int64_t hidden, int64_t intermediate, WorkspaceBuffer scratch, float gate_multiplier) {
  ASSIGN_OR_RETURN(float* gu, env.workspace->Get<float>(scratch, n * 2 * intermediate));
  RETURN_IF_ERROR(Linear(env, x, n, hidden, w.gate_up, 2 * intermediate, w.gate_up_bias, gu, /*accumulate=*/false,
                         "gated mlp gate_up"));
  RETURN_IF_ERROR(ScaleColumns(env, gu, n, 0, intermediate, 2 * intermediate, gate_multiplier));
  kernels::SwiGluParams act;
  act.gate = gu;
  act.up = gu + intermediate;
  act.out = gu;
  act.n_rows = n;
  act.dim = intermediate;
  act.gate_row_stride = 2 * intermediate;
  act.up_row_stride = 2 * intermediate;
  act.out_row_stride = 2 * intermediate;
  RETURN_IF_ERROR(KernelStatusToStatus(env.backend->SwiGlu(act), "SwiGlu"));
  return gu;
}

absl::Status Down(const LayerEnv& env, const DeviceGatedMlpWeights& w, const float* act, int64_t n, int64_t hidden,
                  int64_t intermediate, float* y, bool accumulate) {
  kernels::MatmulParams p;
  p.a = act;
  p.lda = 2 * intermediate;
  p.w = w.down_proj.f32;
  p.w_bf16 = w.down_proj.bf16;
  p.bias = w.down_proj_bias;
  p.out = y;
  p.m = n;
  p.n = hidden;
  p.k = intermediate;
  p.accumulate = accumulate;
  return KernelStatusToStatus(env.backend->Matmul(p, env.matmul_mode), "gated mlp down_proj");
}

class GatedMlpLayerRunner final : public LayerRunner {
 public:
  GatedMlpLayerRunner(const ModelConfig& config, const DeviceGatedMlpWeights& w, const LayerEnv& env)
      : config_(config), w_(w), env_(WithOutputMultiplier(env, config.gated_mlp.down_multiplier)) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    return Run(seg.n_tokens, normed, residual);
  }
  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    return Run(batch.batch, normed, residual);
  }

 private:
  absl::Status Run(int64_t n, const float* normed, float* residual) {
    const int64_t hidden = config_.hidden_size;
    const int64_t inter = config_.gated_mlp.intermediate_size;
    if (env_.residual_multiplier == 1.0f) {
      return GatedMlp(env_, w_, normed, n, hidden, inter, kScratch0, residual, /*accumulate=*/true, gate_multiplier());
    }
    ASSIGN_OR_RETURN(float* y, env_.workspace->Get<float>(kBlockOut, n * hidden));
    RETURN_IF_ERROR(
        GatedMlp(env_, w_, normed, n, hidden, inter, kScratch0, y, /*accumulate=*/false, gate_multiplier()));
    return AddToResidual(env_, y, n, hidden, residual);
  }

  float gate_multiplier() const { return config_.gated_mlp.gate_multiplier; }

  const ModelConfig& config_;
  const DeviceGatedMlpWeights& w_;
  const LayerEnv env_;
};

}  // namespace

absl::Status GatedMlp(const LayerEnv& env, const DeviceGatedMlpWeights& w, const float* x, int64_t n, int64_t hidden,
                      int64_t intermediate, WorkspaceBuffer scratch, float* y, bool accumulate, float gate_multiplier) {
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(float* act, GateUp(env, w, x, n, hidden, intermediate, scratch, gate_multiplier));
  return Down(env, w, act, n, hidden, intermediate, y, accumulate);
}

std::unique_ptr<LayerRunner> NewGatedMlpLayerRunner(const ModelConfig& config, const DeviceGatedMlpWeights& weights,
                                                    const LayerEnv& env) {
  return std::make_unique<GatedMlpLayerRunner>(config, weights, env);
}

}  // namespace hybridserve::engine
