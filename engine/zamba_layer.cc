#include "engine/zamba_layer.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/attention_layer.h"
#include "engine/backend_registry.h"
#include "engine/mamba2_layer.h"
#include "kernels/activation_params.h"
#include "kernels/matmul_params.h"
#include "kernels/norm_params.h"
#include "kernels/rows_params.h"

namespace hybridserve::engine {
namespace {

// Workspace buffers, in the order the layer uses them. The attention runner
// uses kScratch0..2 (qkv, its output, the adapters' low rank) and the Mamba2
// runner kScratch0..3, so what must outlive them lives elsewhere.
constexpr WorkspaceBuffer kCat = kParallelSum;        // [n, 2H]: [h | e], later the Mamba2 input
constexpr WorkspaceBuffer kBlockInput = kMixerInput;  // [n, 2H]: RMSNorm of kCat
constexpr WorkspaceBuffer kAttentionOut = kScratch3;  // [n, H], later the block's output t
constexpr WorkspaceBuffer kFfInput = kScratch0;       // [n, H], later linear(t) + h
constexpr WorkspaceBuffer kGateUp = kScratch1;        // [n, 2I]
constexpr WorkspaceBuffer kLow = kScratch2;           // [n, rank]

class ZambaHybridLayerRunner final : public LayerRunner {
 public:
  ZambaHybridLayerRunner(const ModelConfig& config, const DeviceZambaHybridWeights& w,
                         const DeviceZambaSharedBlock& shared, std::unique_ptr<LayerRunner> attention,
                         std::unique_ptr<LayerRunner> mamba, const LayerEnv& env, std::unique_ptr<QkvAdapters> adapters)
      : config_(config),
        w_(w),
        shared_(shared),
        adapters_(std::move(adapters)),
        attention_(std::move(attention)),
        mamba_(std::move(mamba)),
        env_(env) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* hidden, float* residual) override {
    ASSIGN_OR_RETURN(const float* x, BlockInput(hidden, seg.n_tokens));
    ASSIGN_OR_RETURN(float* a, Zeroed(kAttentionOut, seg.n_tokens));
    RETURN_IF_ERROR(attention_->Prefill(seg, x, a));
    ASSIGN_OR_RETURN(const float* y, MambaInput(hidden, a, seg.n_tokens));
    return mamba_->Prefill(seg, y, residual);
  }

  absl::Status Decode(const DecodeBatch& batch, const float* hidden, float* residual) override {
    ASSIGN_OR_RETURN(const float* x, BlockInput(hidden, batch.batch));
    ASSIGN_OR_RETURN(float* a, Zeroed(kAttentionOut, batch.batch));
    RETURN_IF_ERROR(attention_->Decode(batch, x, a));
    ASSIGN_OR_RETURN(const float* y, MambaInput(hidden, a, batch.batch));
    return mamba_->Decode(batch, y, residual);
  }

 private:
  int64_t hidden_size() const { return config_.hidden_size; }

  absl::StatusOr<float*> Zeroed(WorkspaceBuffer buffer, int64_t n) {
    ASSIGN_OR_RETURN(float* p, env_.workspace->Get<float>(buffer, n * hidden_size()));
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->Fill(p, 0, n * hidden_size() * static_cast<int64_t>(sizeof(float))), "zeroing"));
    return p;
  }

  // out[r, column .. column + H) = x[r] into a zeroed [n, 2H] buffer (0 + x is exact).
  absl::Status CopyColumns(const float* x, int64_t n, float* out, int64_t column) {
    kernels::ScatterAddRowsParams p;
    p.x = x;
    p.out = out + column;
    p.out_row_stride = 2 * hidden_size();
    p.n_rows = n;
    p.dim = hidden_size();
    return KernelStatusToStatus(env_.backend->ScatterAddRows(p), "ScatterAddRows(concat)");
  }

  absl::Status Norm(const float* weight, const float* in, float* out, int64_t n, int64_t dim) {
    kernels::RmsNormParams p;
    p.x = in;
    p.weight = weight;
    p.out = out;
    p.n_rows = n;
    p.dim = dim;
    p.eps = config_.norm_eps;
    return KernelStatusToStatus(env_.backend->RmsNorm(p), "RmsNorm");
  }

  // RMSNorm_2H([h | e]) in kBlockInput.
  absl::StatusOr<const float*> BlockInput(const float* hidden, int64_t n) {
    const int64_t h2 = 2 * hidden_size();
    ASSIGN_OR_RETURN(float* cat, env_.workspace->Get<float>(kCat, n * h2));
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Fill(cat, 0, n * h2 * static_cast<int64_t>(sizeof(float))),
                                         "zeroing the concatenation"));
    ASSIGN_OR_RETURN(const float* embeddings, env_.workspace->Get<float>(kEmbeddings, n * hidden_size()));
    RETURN_IF_ERROR(CopyColumns(hidden, n, cat, 0));
    RETURN_IF_ERROR(CopyColumns(embeddings, n, cat, hidden_size()));
    ASSIGN_OR_RETURN(float* x, env_.workspace->Get<float>(kBlockInput, n * h2));
    RETURN_IF_ERROR(Norm(shared_.input_norm, cat, x, n, h2));
    return x;
  }

  // RMSNorm_H(h + linear(mlp(RMSNorm_H(a)))) in kCat, the Mamba2 layer's input.
  absl::StatusOr<const float*> MambaInput(const float* hidden, float* a, int64_t n) {
    const int64_t hs = hidden_size();
    const int64_t inter = config_.gated_mlp.intermediate_size;
    const int64_t rank = config_.zamba.adapter_rank;
    ASSIGN_OR_RETURN(float* f, env_.workspace->Get<float>(kFfInput, n * hs));
    RETURN_IF_ERROR(Norm(shared_.pre_ff_norm, a, f, n, hs));
    // gate|up = W f (+ bias) + up(down(f)), then act(gate) * up.
    ASSIGN_OR_RETURN(float* gu, env_.workspace->Get<float>(kGateUp, n * 2 * inter));
    RETURN_IF_ERROR(Linear(env_, f, n, hs, shared_.mlp.gate_up, 2 * inter, shared_.mlp.gate_up_bias, gu,
                           /*accumulate=*/false, "zamba mlp gate_up"));
    ASSIGN_OR_RETURN(float* low, env_.workspace->Get<float>(kLow, n * rank));
    RETURN_IF_ERROR(Linear(env_, f, n, hs, w_.gate_up_adapter.down, rank, /*bias=*/nullptr, low,
                           /*accumulate=*/false, "zamba mlp adapter down"));
    RETURN_IF_ERROR(Linear(env_, low, n, rank, w_.gate_up_adapter.up, 2 * inter, /*bias=*/nullptr, gu,
                           /*accumulate=*/true, "zamba mlp adapter up"));
    kernels::SwiGluParams act;
    act.gate = gu;
    act.up = gu + inter;
    act.out = gu;
    act.n_rows = n;
    act.dim = inter;
    act.gate_row_stride = 2 * inter;
    act.up_row_stride = 2 * inter;
    act.out_row_stride = 2 * inter;
    act.gate_activation = config_.gated_mlp.activation == GateActivation::kGelu ? kernels::ActivationKind::kGelu
                                                                                : kernels::ActivationKind::kSilu;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->SwiGlu(act), "SwiGlu(zamba mlp)"));
    float* t = a;  // a is no longer needed
    kernels::MatmulParams down;
    down.a = gu;
    down.lda = 2 * inter;
    down.w = shared_.mlp.down_proj.f32;
    down.w_bf16 = shared_.mlp.down_proj.bf16;
    down.bias = shared_.mlp.down_proj_bias;
    down.out = t;
    down.m = n;
    down.n = hs;
    down.k = inter;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->Matmul(down, env_.matmul_mode), "zamba mlp down_proj"));
    // linear(t) + h, then the Mamba2 layer's norm.
    float* sum = f;  // f is no longer needed
    RETURN_IF_ERROR(Linear(env_, t, n, hs, w_.linear, hs, /*bias=*/nullptr, sum, /*accumulate=*/false, "zamba linear"));
    kernels::ScatterAddRowsParams add;
    add.x = hidden;
    add.out = sum;
    add.n_rows = n;
    add.dim = hs;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->ScatterAddRows(add), "ScatterAddRows(zamba input)"));
    ASSIGN_OR_RETURN(float* y, env_.workspace->Get<float>(kCat, n * 2 * hs));
    RETURN_IF_ERROR(Norm(w_.mamba_norm, sum, y, n, hs));
    return y;
  }

  const ModelConfig& config_;
  const DeviceZambaHybridWeights& w_;
  const DeviceZambaSharedBlock& shared_;
  std::unique_ptr<QkvAdapters> adapters_;  // the attention runner points at it
  std::unique_ptr<LayerRunner> attention_;
  std::unique_ptr<LayerRunner> mamba_;
  const LayerEnv env_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LayerRunner>> NewZambaHybridLayerRunner(const ModelConfig& config,
                                                                       const DeviceZambaHybridWeights& weights,
                                                                       const DeviceZambaSharedBlock& shared,
                                                                       int64_t state_layer, int64_t kv_layer,
                                                                       const LayerEnv& env) {
  // The block's attention adds into a zeroed buffer and the Mamba2 layer into
  // the residual stream, both without a multiplier (Zamba2 has none).
  auto adapters = std::make_unique<QkvAdapters>();
  AttentionRunnerOptions options;
  options.input_dim = 2 * config.hidden_size;
  if (config.zamba.use_adapters) {
    adapters->down = weights.qkv_adapter_down;
    adapters->q_up = weights.q_adapter_up;
    adapters->k_up = weights.k_adapter_up;
    adapters->v_up = weights.v_adapter_up;
    adapters->rank = config.zamba.adapter_rank;
    options.adapters = adapters.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LayerRunner> attention,
                   NewAttentionLayerRunner(config, shared.attention, kv_layer, env, options));
  std::unique_ptr<LayerRunner> mamba = NewMamba2LayerRunner(config, weights.mamba, state_layer, env);
  return std::unique_ptr<LayerRunner>(new ZambaHybridLayerRunner(config, weights, shared, std::move(attention),
                                                                 std::move(mamba), env, std::move(adapters)));
}

}  // namespace hybridserve::engine
