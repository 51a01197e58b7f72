#include "engine/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "kernels/activation_params.h"
#include "kernels/matmul_params.h"
#include "kernels/rows_params.h"
#include "kernels/torch_topk.h"

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
  absl::Status Run(int64_t n, const float* normed, float* residual) {
    if (n == 0) return absl::OkStatus();
    const int64_t hidden = config_.hidden_size;
    const int64_t experts = p_.num_experts;
    const int64_t inter = p_.intermediate_size;

    if (w_.router_bias != nullptr && host_router_bias_.empty()) {
      host_router_bias_.resize(static_cast<size_t>(experts));
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->CopyToHost(host_router_bias_.data(), w_.router_bias,
                                                                    experts * static_cast<int64_t>(sizeof(float))),
                                           "copying the router bias"));
    }
    // The router's rows: the experts', then the shared expert's gate (Qwen).
    const int64_t logit_cols = router_rows();
    ASSIGN_OR_RETURN(float* logits, env_.workspace->Get<float>(kRouterLogits, n * logit_cols));
    RETURN_IF_ERROR(Linear(env_, normed, n, hidden, w_.router, logit_cols, /*bias=*/nullptr, logits,
                           /*accumulate=*/false, "moe router"));
    host_logits_.resize(static_cast<size_t>(n * logit_cols));
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->CopyToHost(host_logits_.data(), logits, n * logit_cols * static_cast<int64_t>(sizeof(float))),
        "copying router logits"));
    Route(n);

    const int64_t routed = n * p_.top_k;
    const int64_t dim = p_.expert_dim(hidden);
    // The routed experts' input: x, or fc1_latent_proj(x) of every row (as transformers projects them).
    const float* expert_in = normed;
    if (w_.has_latent) {
      ASSIGN_OR_RETURN(float* latent, env_.workspace->Get<float>(kLatentIn, n * dim));
      RETURN_IF_ERROR(Linear(env_, normed, n, hidden, w_.latent_in, dim, /*bias=*/nullptr, latent,
                             /*accumulate=*/false, "moe fc1_latent_proj"));
      expert_in = latent;
    }
    // With a gated shared expert, rows_ and weights_ continue past the routed
    // entries with each row once and its gate sigmoid(logit) (Route).
    ASSIGN_OR_RETURN(const int32_t* rows,
                     env_.workspace->Upload(kRouteRows, rows_.data(), static_cast<int64_t>(rows_.size())));
    ASSIGN_OR_RETURN(const float* weights,
                     env_.workspace->Upload(kRouteWeights, weights_.data(), static_cast<int64_t>(weights_.size())));
    ASSIGN_OR_RETURN(float* gathered, env_.workspace->Get<float>(kGathered, routed * dim));
    kernels::GatherRowsParams gather;
    gather.x = expert_in;
    gather.index = rows;
    gather.out = gathered;
    gather.n_rows = routed;
    gather.dim = dim;
    RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->GatherRows(gather), "GatherRows(moe)"));

    // The experts' up (gate|up) projections, routed and shared, in one
    // MatmulBatch, their activations, then their down projections in another:
    // two parallel regions per block however many experts the rows chose.
    // Each expert's rows get the bits its own Matmul gives (MatmulBatch).
    const int64_t up_cols = p_.up_rows(inter);
    const int64_t shared_inter = w_.has_shared ? p_.shared_intermediate_size : 0;
    const int64_t shared_up_cols = w_.has_shared ? p_.up_rows(shared_inter) : 0;
    ASSIGN_OR_RETURN(float* up_out, env_.workspace->Get<float>(kExpertScratch, routed * up_cols + n * shared_up_cols));
    ASSIGN_OR_RETURN(float* expert_out, env_.workspace->Get<float>(kExpertOut, routed * dim + n * hidden));
    float* shared_up_out = up_out + routed * up_cols;
    float* shared_out = expert_out + routed * dim;
    ASSIGN_OR_RETURN(float* sum, env_.workspace->Get<float>(kSum, n * hidden));

    items_.clear();
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t first = offsets_[static_cast<size_t>(e)];
      const int64_t count = offsets_[static_cast<size_t>(e) + 1] - first;
      if (count == 0) continue;
      items_.push_back(Projection(gathered + first * dim, dim, count, dim, RowsFrom(w_.experts_up, e * up_cols, dim),
                                  up_cols, nullptr, up_out + first * up_cols));
    }
    if (w_.has_shared) {
      items_.push_back(
          Projection(normed, hidden, n, hidden, w_.shared_up, shared_up_cols, w_.shared_up_bias, shared_up_out));
    }
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->MatmulBatch(items_.data(), static_cast<int64_t>(items_.size()), env_.matmul_mode),
        "MatmulBatch(moe up)"));
    RETURN_IF_ERROR(Activate(up_out, routed, inter));
    if (w_.has_shared) RETURN_IF_ERROR(Activate(shared_up_out, n, shared_inter));

    items_.clear();
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t first = offsets_[static_cast<size_t>(e)];
      const int64_t count = offsets_[static_cast<size_t>(e) + 1] - first;
      if (count == 0) continue;
      items_.push_back(Projection(up_out + first * up_cols, up_cols, count, inter,
                                  RowsFrom(w_.experts_down, e * dim, inter), dim, nullptr, expert_out + first * dim));
    }
    if (w_.has_shared) {
      items_.push_back(Projection(shared_up_out, shared_up_cols, n, shared_inter, w_.shared_down, hidden,
                                  w_.shared_down_bias, shared_out));
    }
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->MatmulBatch(items_.data(), static_cast<int64_t>(items_.size()), env_.matmul_mode),
        "MatmulBatch(moe down)"));

    // Where the routed experts' weighted sum goes: the block's output itself,
    // or its latent form, projected by fc2_latent_proj below.
    float* routed_sum = sum;
    if (w_.has_latent) {
      ASSIGN_OR_RETURN(routed_sum, env_.workspace->Get<float>(kLatentSum, n * dim));
    }
    RETURN_IF_ERROR(KernelStatusToStatus(
        env_.backend->Fill(routed_sum, 0, n * dim * static_cast<int64_t>(sizeof(float))), "zeroing the moe output"));
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t first = offsets_[static_cast<size_t>(e)];
      const int64_t count = offsets_[static_cast<size_t>(e) + 1] - first;
      if (count == 0) continue;
      // routed_sum[row] += expert_out * weight, expert by expert (a row occurs once per expert).
      kernels::ScatterAddRowsParams add;
      add.x = expert_out + first * dim;
      add.index = rows + first;
      add.weight = weights + first;
      add.alpha = 1.0f;
      add.out = routed_sum;
      add.n_rows = count;
      add.dim = dim;
      RETURN_IF_ERROR(KernelStatusToStatus(env_.backend->ScatterAddRows(add), "ScatterAddRows(moe)"));
    }
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

  // out [m, n] = a [m, k] (row stride lda) @ w^T + bias: one item of a MatmulBatch.
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

  // Row r's experts (choice_[r * k, ...)) and weights, per MoeRouter.
  void ChooseTopKSoftmax(const float* l, int64_t r) {
    const int64_t k = p_.top_k;
    std::iota(order_.begin(), order_.end(), 0);
    // The k largest logits, largest first; ties go to the lower expert id.
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    // Softmax over those k logits (fp32, max subtracted, as torch computes it).
    const float top = l[order_[0]];
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float v = std::exp(l[order_[static_cast<size_t>(j)]] - top);
      choice_weight_[static_cast<size_t>(r * k + j)] = v;
      total += v;
    }
    for (int64_t j = 0; j < k; ++j) {
      choice_[static_cast<size_t>(r * k + j)] = order_[static_cast<size_t>(j)];
      choice_weight_[static_cast<size_t>(r * k + j)] /= total;
    }
  }

  // Qwen: softmax over every expert (fp32, max subtracted, then divided by
  // the sum, as the reference block computes it), the top_k by torch.topk's
  // CPU order (ties included), divided by their sum when norm_topk_prob.
  void ChooseSoftmaxTopK(const float* l, int64_t r) {
    const int64_t experts = p_.num_experts;
    const int64_t k = p_.top_k;
    scores_.assign(l, l + experts);
    const float top = *std::max_element(scores_.begin(), scores_.end());
    float total = 0.0f;
    for (float& v : scores_) {
      v = std::exp(v - top);
      total += v;
    }
    for (float& v : scores_) v /= total;
    kernels::TorchTopKIndices(scores_.data(), experts, k, &choice_[static_cast<size_t>(r * k)]);
    float chosen = 0.0f;
    for (int64_t j = 0; j < k; ++j) chosen += scores_[static_cast<size_t>(choice_[static_cast<size_t>(r * k + j)])];
    for (int64_t j = 0; j < k; ++j) {
      const float p = scores_[static_cast<size_t>(choice_[static_cast<size_t>(r * k + j)])];
      choice_weight_[static_cast<size_t>(r * k + j)] = p_.norm_topk_prob ? p / chosen : p;
    }
  }

  void ChooseSigmoidGroupTopK(const float* l, int64_t r) {
    const int64_t experts = p_.num_experts;
    const int64_t k = p_.top_k;
    const int64_t per_group = experts / p_.n_group;
    scores_.resize(static_cast<size_t>(experts));
    choice_score_.resize(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      scores_[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
      choice_score_[static_cast<size_t>(e)] =
          scores_[static_cast<size_t>(e)] +
          (host_router_bias_.empty() ? 0.0f : host_router_bias_[static_cast<size_t>(e)]);
    }
    const float* c = choice_score_.data();
    auto better = [c](int32_t a, int32_t b) { return c[a] > c[b] || (c[a] == c[b] && a < b); };
    // Groups scored by the sum of their two best choices; the topk_group best kept.
    std::vector<float>& group_score = group_score_;
    group_score.assign(static_cast<size_t>(p_.n_group), 0.0f);
    for (int64_t g = 0; g < p_.n_group; ++g) {
      float best = -std::numeric_limits<float>::infinity();
      float second = -std::numeric_limits<float>::infinity();
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float v = c[e];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[static_cast<size_t>(g)] = per_group >= 2 ? best + second : best;
    }
    group_order_.resize(static_cast<size_t>(p_.n_group));
    std::iota(group_order_.begin(), group_order_.end(), 0);
    std::partial_sort(group_order_.begin(), group_order_.begin() + p_.topk_group, group_order_.end(),
                      [&group_score](int32_t a, int32_t b) {
                        return group_score[static_cast<size_t>(a)] > group_score[static_cast<size_t>(b)] ||
                               (group_score[static_cast<size_t>(a)] == group_score[static_cast<size_t>(b)] && a < b);
                      });
    // The top_k best choices among the kept groups' experts.
    order_.clear();
    for (int64_t j = 0; j < p_.topk_group; ++j) {
      const int64_t g = group_order_[static_cast<size_t>(j)];
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) order_.push_back(static_cast<int32_t>(e));
    }
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), better);
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order_[static_cast<size_t>(j)];
      choice_[static_cast<size_t>(r * k + j)] = e;
      choice_weight_[static_cast<size_t>(r * k + j)] = scores_[static_cast<size_t>(e)];
      total += scores_[static_cast<size_t>(e)];
    }
    for (int64_t j = 0; j < k; ++j) {
      float& w = choice_weight_[static_cast<size_t>(r * k + j)];
      if (p_.norm_topk_prob) w /= total + 1e-20f;
      w *= p_.routed_scaling_factor;
    }
    order_.resize(static_cast<size_t>(experts));
  }

  // Fills rows_/weights_ grouped by expert (ascending), rows ascending within
  // an expert, and offsets_[e] .. offsets_[e + 1] the range of expert e.
  void Route(int64_t n) {
    const int64_t experts = p_.num_experts;
    const int64_t k = p_.top_k;
    choice_.resize(static_cast<size_t>(n * k));
    choice_weight_.resize(static_cast<size_t>(n * k));
    order_.resize(static_cast<size_t>(experts));
    for (int64_t r = 0; r < n; ++r) {
      const float* l = host_logits_.data() + r * router_rows();
      if (p_.router == MoeRouter::kTopKSoftmax) {
        ChooseTopKSoftmax(l, r);
      } else if (p_.router == MoeRouter::kSoftmaxTopK) {
        ChooseSoftmaxTopK(l, r);
      } else {
        ChooseSigmoidGroupTopK(l, r);
      }
    }
    offsets_.assign(static_cast<size_t>(experts) + 1, 0);
    for (int32_t e : choice_) ++offsets_[static_cast<size_t>(e) + 1];
    for (int64_t e = 0; e < experts; ++e) offsets_[static_cast<size_t>(e) + 1] += offsets_[static_cast<size_t>(e)];
    const int64_t extra = p_.shared_gate ? n : 0;
    rows_.resize(static_cast<size_t>(n * k + extra));
    weights_.resize(static_cast<size_t>(n * k + extra));
    std::vector<int64_t> next(offsets_.begin(), offsets_.end() - 1);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t at = static_cast<size_t>(next[static_cast<size_t>(choice_[static_cast<size_t>(r * k + j)])]++);
        rows_[at] = static_cast<int32_t>(r);
        weights_[at] = choice_weight_[static_cast<size_t>(r * k + j)];
      }
    }
    // The shared expert's gate per row: sigmoid of the router's last column (torch: 1 / (1 + exp(-x))).
    for (int64_t r = 0; r < extra; ++r) {
      const float logit = host_logits_[static_cast<size_t>(r * router_rows() + experts)];
      rows_[static_cast<size_t>(n * k + r)] = static_cast<int32_t>(r);
      weights_[static_cast<size_t>(n * k + r)] = 1.0f / (1.0f + std::exp(-logit));
    }
  }

  int64_t router_rows() const { return p_.num_experts + (p_.shared_gate ? 1 : 0); }

  const ModelConfig& config_;
  const MoeParams& p_;
  const DeviceMoeWeights& w_;
  const LayerEnv env_;
  // Host routing buffers, kept to avoid reallocation per call.
  std::vector<float> host_logits_;
  std::vector<float> host_router_bias_;  // empty without a router bias
  std::vector<int32_t> order_;
  std::vector<float> scores_;
  std::vector<float> choice_score_;
  std::vector<float> group_score_;
  std::vector<int32_t> group_order_;
  std::vector<int32_t> choice_;
  std::vector<float> choice_weight_;
  std::vector<int64_t> offsets_;
  std::vector<int32_t> rows_;
  std::vector<float> weights_;
  std::vector<kernels::MatmulParams> items_;  // a MatmulBatch's items
};

}  // namespace

std::unique_ptr<LayerRunner> NewMoeLayerRunner(const ModelConfig& config, const DeviceMoeWeights& weights,
                                               const LayerEnv& env) {
  return std::make_unique<MoeLayerRunner>(config, weights, env);
}

}  // namespace hybridserve::engine
