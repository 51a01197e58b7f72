#include "engine/parallel_layer.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/attention_layer.h"
#include "engine/backend_registry.h"
#include "engine/mamba2_layer.h"

namespace hybridserve::engine {
namespace {

class ParallelLayerRunner final : public LayerRunner {
 public:
  ParallelLayerRunner(const ModelConfig& config, std::unique_ptr<LayerRunner> mamba,
                      std::unique_ptr<LayerRunner> attention, const LayerEnv& env)
      : config_(config), mamba_(std::move(mamba)), attention_(std::move(attention)), env_(env) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    ASSIGN_OR_RETURN(float* sum, ZeroedSum(seg.n_tokens));
    RETURN_IF_ERROR(mamba_->Prefill(seg, normed, sum));
    RETURN_IF_ERROR(attention_->Prefill(seg, normed, sum));
    return AddToResidual(env_, sum, seg.n_tokens, config_.hidden_size, residual);
  }

  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    ASSIGN_OR_RETURN(float* sum, ZeroedSum(batch.batch));
    RETURN_IF_ERROR(mamba_->Decode(batch, normed, sum));
    RETURN_IF_ERROR(attention_->Decode(batch, normed, sum));
    return AddToResidual(env_, sum, batch.batch, config_.hidden_size, residual);
  }

 private:
  absl::StatusOr<float*> ZeroedSum(int64_t n) {
    const int64_t count = n * config_.hidden_size;
    ASSIGN_OR_RETURN(float* sum, env_.workspace->Get<float>(kParallelSum, count));
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Fill(sum, 0, count * static_cast<int64_t>(sizeof(float))),
                                         "zeroing the parallel block's sum"));
    return sum;
  }

  const ModelConfig& config_;
  std::unique_ptr<LayerRunner> mamba_;
  std::unique_ptr<LayerRunner> attention_;
  const LayerEnv env_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerRunner>> NewParallelLayerRunner(const ModelConfig& config,
                                                                    const DeviceParallelWeights& weights,
                                                                    int64_t state_layer, int64_t kv_layer,
                                                                    const LayerEnv& env) {
  // The two mixers add into the block's sum with their own out-multipliers
  // only; the model's residual multiplier applies once, to the sum.
  LayerEnv inner = env;
  inner.residual_multiplier = 1.0f;
  std::unique_ptr<LayerRunner> mamba = NewMamba2LayerRunner(config, weights.mamba, state_layer, inner);
  ASSIGN_OR_RETURN(std::unique_ptr<LayerRunner> attention,
                   NewAttentionLayerRunner(config, weights.attention, kv_layer, inner));
  return std::unique_ptr<LayerRunner>(new ParallelLayerRunner(config, std::move(mamba), std::move(attention), env));
}

}  // namespace hybridserve::engine
