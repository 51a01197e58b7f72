#include "engine/moe_layer.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"
#include "kernels/matmul_params.h"
#include "kernels/moe_params.h"
#include "kernels/rows_params.h"

namespace hybridserve::engine {
namespace {

// d = MoeParams::expert_dim(hidden): the routed experts' width.
constexpr WorkspaceBuffer kRouterLogits = kScratch0;   // [n, experts]
constexpr WorkspaceBuffer kGathered = kScratch1;       // [n * top_k, d]: rows grouped by expert
constexpr WorkspaceBuffer kExpertScratch = kScratch2;  // up projections: [n * top_k, up_rows(inter)], the shared's
constexpr WorkspaceBuffer kExpertOut = kScratch3;      // down projections: [n * top_k, d], the shared's [n, hidden]
constexpr WorkspaceBuffer kSum = kBlockOut;            // [n, hidden]: the block's output
// With latent projections only (otherwise unused by this block).
constexpr WorkspaceBuffer kLatentIn = kMixerInput;    // [n, latent]: fc1_latent_proj(x)
constexpr WorkspaceBuffer kLatentSum = kParallelSum;  // [n, latent]: the routed experts' weighted sum

class MoeLayerRunner final : public LayerRunner {
 public:
  MoeLayerRunner(const ModelConfig& config, const DeviceMoeWeights& w, const LayerEnv& env)
      : config_(config), p_(config.moe), w_(w), env_(env) {}

  absl::Status Prefill(const PrefillSegment& seg, const float* normed, float* residual) override {
    return Run(seg.n_tokens, normed, residual);
  }
  absl::Status Decode(const DecodeBatch& batch, const float* normed, float* residual) override {
    return Run(batch.batch, normed, residual);
  }

 private:
  // Rows are independent, so a long prefill is routed and run in pieces of
  // at most kMaxMoeRouteEntries entries (one MoeRoute call each).
  absl::Status Run(int64_t n, const float* normed, float* residual) {
    const int64_t hidden = config_.hidden_size;
    const int64_t piece = std::max<int64_t>(1, kernels::kMaxMoeRouteEntries / p_.top_k);
    for (int64_t r0 = 0; r0 < n; r0 += piece) {
      RETURN_IF_ERROR(RunPiece(std::min(piece, n - r0), normed + r0 * hidden, residual + r0 * hidden));
    }
    return absl::OkStatus();
  }

  absl::Status RunPiece(int64_t n, const float* normed, float* residual) {
    const int64_t hidden = config_.hidden_size;
    const int64_t experts = p_.num_experts;
    const int64_t inter = p_.intermediate_size;
    const int64_t k = p_.top_k;
    const int64_t routed = n * k;

    // The router's rows: the experts', then the shared expert's gate (Qwen).
    const int64_t logit_cols = experts + (p_.shared_gate ? 1 : 0);
    ASSIGN_OR_RETURN(float* logits, env_.workspace->Get<float>(kRouterLogits, n * logit_cols));
    RETURN_IF_ERROR(Linear(env_, normed, n, hidden, w_.router, logit_cols, /*bias=*/nullptr, logits,
                           /*accumulate=*/false, "moe router"));
    // Routing on the device: entries grouped by ascending expert, rows
    // ascending within an expert; with a gated shared expert, rows/weights
    // continue past the routed entries with each row once and its gate.
    const int64_t entries = routed + (p_.shared_gate ? n : 0);
    ASSIGN_OR_RETURN(int32_t * rows, env_.workspace->Get<int32_t>(kRouteRows, entries));
    ASSIGN_OR_RETURN(float* weights, env_.workspace->Get<float>(kRouteWeights, entries));
    ASSIGN_OR_RETURN(int32_t * offsets, env_.workspace->Get<int32_t>(kRouteOffsets, experts + 1));
    ASSIGN_OR_RETURN(int32_t * slots, env_.workspace->Get<int32_t>(kRouteSlots, routed));
    kernels::MoeRouteParams route;
    route.logits = logits;
    route.bias = w_.router_bias;
    route.rows = rows;
    route.weights = weights;
    route.offsets = offsets;
    route.slots = slots;
    route.n_rows = n;
    route.experts = experts;
    route.top_k = k;
    route.kind = RouterKind();
    route.n_group = p_.n_group;
    route.topk_group = p_.topk_group;
    route.norm_topk_prob = p_.norm_topk_prob;
    route.routed_scaling_factor = p_.routed_scaling_factor;
    route.shared_gate = p_.shared_gate;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->MoeRoute(route), "MoeRoute"));

    const int64_t dim = p_.expert_dim(hidden);
    // The routed experts' input: x, or fc1_latent_proj(x) of every row (as transformers projects them).
    const float* expert_in = normed;
    if (w_.has_latent) {
      ASSIGN_OR_RETURN(float* latent, env_.workspace->Get<float>(kLatentIn, n * dim));
      RETURN_IF_ERROR(Linear(env_, normed, n, hidden, w_.latent_in, dim, /*bias=*/nullptr, latent,
                             /*accumulate=*/false, "moe fc1_latent_proj"));
      expert_in = latent;
    }
    ASSIGN_OR_RETURN(float* gathered, env_.workspace->Get<float>(kGathered, routed * dim));
    kernels::GatherRowsParams gather;
    gather.x = expert_in;
    gather.index = rows;
    gather.out = gathered;
    gather.n_rows = routed;
    gather.dim = dim;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatherRows(gather), "GatherRows(moe)"));

    // The experts' up (gate|up) projections over their grouped rows, with the
    // shared expert's in the same call, their activations, then the down
    // projections likewise: each expert's rows get the bits of its own Matmul
    // (ExpertMatmul), and the row counts stay on the device.
    const int64_t up_cols = p_.up_rows(inter);
    const int64_t shared_inter = w_.has_shared ? p_.shared_intermediate_size : 0;
    const int64_t shared_up_cols = w_.has_shared ? p_.up_rows(shared_inter) : 0;
    ASSIGN_OR_RETURN(float* up_out, env_.workspace->Get<float>(kExpertScratch, routed * up_cols + n * shared_up_cols));
    ASSIGN_OR_RETURN(float* expert_out, env_.workspace->Get<float>(kExpertOut, routed * dim + n * hidden));
    float* shared_up_out = up_out + routed * up_cols;
    float* shared_out = expert_out + routed * dim;
    ASSIGN_OR_RETURN(float* sum, env_.workspace->Get<float>(kSum, n * hidden));

    kernels::MatmulParams shared_up;
    if (w_.has_shared) {
      shared_up = Projection(normed, hidden, n, hidden, w_.shared_up, shared_up_cols, w_.shared_up_bias, shared_up_out);
    }
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->ExpertMatmul(Experts(gathered, dim, offsets, routed, n, w_.experts_up, up_cols, up_out),
                                   &shared_up, w_.has_shared ? 1 : 0, env_.matmul_mode),
        "ExpertMatmul(moe up)"));
    RETURN_IF_ERROR(Activate(up_out, routed, inter));
    if (w_.has_shared) RETURN_IF_ERROR(Activate(shared_up_out, n, shared_inter));

    kernels::ExpertMatmulParams down = Experts(up_out, inter, offsets, routed, n, w_.experts_down, dim, expert_out);
    down.lda = up_cols;
    kernels::MatmulParams shared_down;
    if (w_.has_shared) {
      shared_down = Projection(shared_up_out, shared_up_cols, n, shared_inter, w_.shared_down, hidden,
                               w_.shared_down_bias, shared_out);
    }
    RETURN_IF_ERROR(
        KernelStatusToStatus(env_.backend->ExpertMatmul(down, &shared_down, w_.has_shared ? 1 : 0, env_.matmul_mode),
                             "ExpertMatmul(moe down)"));

    // Where the routed experts' weighted sum goes: the block's output itself,
    // or its latent form, projected by fc2_latent_proj below.
    float* routed_sum = sum;
    if (w_.has_latent) {
      ASSIGN_OR_RETURN(routed_sum, env_.workspace->Get<float>(kLatentSum, n * dim));
    }
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->Fill(routed_sum, 0, n * dim * static_cast<int64_t>(sizeof(float))), "zeroing the moe output"));
    // routed_sum[row] += expert_out * weight over the row's experts in
    // ascending order: the bits of a ScatterAddRows per expert.
    kernels::MoeCombineParams combine;
    combine.x = expert_out;
    combine.slots = slots;
    combine.weights = weights;
    combine.out = routed_sum;
    combine.n_rows = n;
    combine.per_row = k;
    combine.dim = dim;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->MoeCombine(combine), "MoeCombine"));
    if (w_.has_latent) {
      // transformers: fc2_latent_proj(routed sum), then + shared_experts(x).
      RETURN_IF_ERROR(Linear(env_, routed_sum, n, dim, w_.latent_out, hidden, /*bias=*/nullptr, sum,
                             /*accumulate=*/false, "moe fc2_latent_proj"));
    }
    if (w_.has_shared) {
      // Qwen: sum += sigmoid(gate(x)) * shared(x), the product rounded then
      // added, as transformers adds the gated shared output to the routed sum.
      // Otherwise sum += shared(x): the bits of a down projection that
      // accumulates into sum (out + (dot + bias)).
      kernels::ScatterAddRowsParams add;
      add.x = shared_out;
      add.index = p_.shared_gate ? rows + routed : nullptr;
      add.weight = p_.shared_gate ? weights + routed : nullptr;
      add.alpha = 1.0f;
      add.out = sum;
      add.n_rows = n;
      add.dim = hidden;
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->ScatterAddRows(add), "ScatterAddRows(moe shared)"));
    }
    return AddToResidual(env_, sum, n, hidden, residual);
  }

  kernels::MoeRouterKind RouterKind() const {
    switch (p_.router) {
      case MoeRouter::kTopKSoftmax:
        return kernels::MoeRouterKind::kTopKSoftmax;
      case MoeRouter::kSoftmaxTopK:
        return kernels::MoeRouterKind::kSoftmaxTopK;
      case MoeRouter::kSigmoidGroupTopK:
        return kernels::MoeRouterKind::kSigmoidGroupTopK;
    }
    return kernels::MoeRouterKind::kTopKSoftmax;
  }

  // The routed experts' projection out[rows, n] of a[rows, k] (grouped by
  // expert), expert e's weights rows [e * n, (e + 1) * n) of w; at most
  // `tokens` rows per expert.
  kernels::ExpertMatmulParams Experts(const float* a, int64_t k, const int32_t* offsets, int64_t rows, int64_t tokens,
                                      const DeviceMatrix& w, int64_t n, float* out) const {
    kernels::ExpertMatmulParams e;
    e.a = a;
    e.offsets = offsets;
    e.w = w.f32;
    e.w_bf16 = w.bf16;
    e.out = out;
    e.experts = p_.num_experts;
    e.rows = rows;
    e.max_rows = tokens;
    e.n = n;
    e.k = k;
    return e;
  }

  // out [m, n] = a [m, k] (row stride lda) @ w^T + bias: the shared expert's
  // projection, issued with the routed experts'.
  static kernels::MatmulParams Projection(const float* a, int64_t lda, int64_t m, int64_t k, const DeviceMatrix& w,
                                          int64_t n, const float* bias, float* out) {
    kernels::MatmulParams p = LinearParams(a, m, k, w, n, bias, out, /*accumulate=*/false);
    p.lda = lda;
    return p;
  }

  // The activation over rows of an up projection's output (row stride
  // up_rows(inter)), in place: silu(gate) * up into the gate half (SwiGLU),
  // or relu(x)^2 (relu2).
  absl::Status Activate(float* h, int64_t rows, int64_t inter) {
    if (rows == 0) return absl::OkStatus();
    if (p_.expert == ExpertKind::kSwiGlu) {
      kernels::SwiGluParams act;
      act.gate = h;
      act.up = h + inter;
      act.out = h;
      act.n_rows = rows;
      act.dim = inter;
      act.gate_row_stride = 2 * inter;
      act.up_row_stride = 2 * inter;
      act.out_row_stride = 2 * inter;
      return KernelStatusToStatus(env_.backend->SwiGlu(act), "SwiGlu(moe)");
    }
    kernels::ActivationParams act;
    act.x = h;
    act.out = h;
    act.n_rows = rows;
    act.dim = inter;
    act.kind = kernels::ActivationKind::kReluSquared;
    return KernelStatusToStatus(env_.backend->Activation(act), "Activation(relu2)");
  }

  const ModelConfig& config_;
  const MoeParams& p_;
  const DeviceMoeWeights& w_;
  const LayerEnv env_;
};

}  // namespace

std::unique_ptr<LayerRunner> NewMoeLayerRunner(const ModelConfig& config, const DeviceMoeWeights& weights,
                                               const LayerEnv& env) {
  return std::make_unique<MoeLayerRunner>(config, weights, env);
}

}  // namespace hybridserve::engine
