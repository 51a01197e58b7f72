#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/kernel_status.h"
#include "kernels/torch_topk.h"

namespace hybridserve::kernels::cpu {
namespace {

// One row's choice: experts[j] and weights[j] for j < top_k, in the order
// the router ranks them.
class RowRouter {
 public:
  explicit RowRouter(const MoeRouteParams& p) : p_(p), order_(static_cast<size_t>(p.experts)) {}

  void Choose(const float* l, int32_t* experts, float* weights) {
    switch (p_.kind) {
      case MoeRouterKind::kTopKSoftmax:
        TopKSoftmax(l, experts, weights);
        return;
      case MoeRouterKind::kSoftmaxTopK:
        SoftmaxTopK(l, experts, weights);
        return;
      case MoeRouterKind::kSigmoidGroupTopK:
        SigmoidGroupTopK(l, experts, weights);
        return;
    }
  }

 private:
  void TopKSoftmax(const float* l, int32_t* experts, float* weights) {
    const int64_t k = p_.top_k;
    std::iota(order_.begin(), order_.end(), 0);
    // The k largest logits, largest first; ties go to the lower expert id.
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    // Softmax over those k logits (fp32, max subtracted, as torch computes it).
    const float top = l[order_[0]];
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      weights[j] = std::exp(l[order_[static_cast<size_t>(j)]] - top);
      total += weights[j];
    }
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = order_[static_cast<size_t>(j)];
      weights[j] /= total;
    }
  }

  void SoftmaxTopK(const float* l, int32_t* experts, float* weights) {
    const int64_t n = p_.experts;
    const int64_t k = p_.top_k;
    scores_.assign(l, l + n);
    const float top = *std::max_element(scores_.begin(), scores_.end());
    float total = 0.0f;
    for (float& v : scores_) {
      v = std::exp(v - top);
      total += v;
    }
    for (float& v : scores_) v /= total;
    TorchTopKIndices(scores_.data(), n, k, experts);
    float chosen = 0.0f;
    for (int64_t j = 0; j < k; ++j) chosen += scores_[static_cast<size_t>(experts[j])];
    for (int64_t j = 0; j < k; ++j) {
      const float s = scores_[static_cast<size_t>(experts[j])];
      weights[j] = p_.norm_topk_prob ? s / chosen : s;
    }
  }

  void SigmoidGroupTopK(const float* l, int32_t* experts, float* weights) {
    const int64_t n = p_.experts;
    const int64_t k = p_.top_k;
    const int64_t per_group = n / p_.n_group;
    scores_.resize(static_cast<size_t>(n));
    choice_.resize(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) {
      scores_[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-l[e]));
      choice_[static_cast<size_t>(e)] = scores_[static_cast<size_t>(e)] + (p_.bias != nullptr ? p_.bias[e] : 0.0f);
    }
    const float* c = choice_.data();
    // Groups scored by the sum of their two best choices; the topk_group best kept.
    group_score_.assign(static_cast<size_t>(p_.n_group), 0.0f);
    for (int64_t g = 0; g < p_.n_group; ++g) {
      float best = -std::numeric_limits<float>::infinity();
      float second = -std::numeric_limits<float>::infinity();
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
        if (c[e] > best) {
          second = best;
          best = c[e];
        } else if (c[e] > second) {
          second = c[e];
        }
      }
      group_score_[static_cast<size_t>(g)] = per_group >= 2 ? best + second : best;
    }
    group_order_.resize(static_cast<size_t>(p_.n_group));
    std::iota(group_order_.begin(), group_order_.end(), 0);
    const float* gs = group_score_.data();
    std::partial_sort(group_order_.begin(), group_order_.begin() + p_.topk_group, group_order_.end(),
                      [gs](int32_t a, int32_t b) { return gs[a] > gs[b] || (gs[a] == gs[b] && a < b); });
    // The top_k best choices among the kept groups' experts.
    order_.clear();
    for (int64_t j = 0; j < p_.topk_group; ++j) {
      const int64_t g = group_order_[static_cast<size_t>(j)];
      for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) order_.push_back(static_cast<int32_t>(e));
    }
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [c](int32_t a, int32_t b) { return c[a] > c[b] || (c[a] == c[b] && a < b); });
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      experts[j] = order_[static_cast<size_t>(j)];
      weights[j] = scores_[static_cast<size_t>(experts[j])];
      total += weights[j];
    }
    for (int64_t j = 0; j < k; ++j) {
      if (p_.norm_topk_prob) weights[j] /= total + 1e-20f;
      weights[j] *= p_.routed_scaling_factor;
    }
    order_.resize(static_cast<size_t>(n));
  }

  const MoeRouteParams& p_;
  std::vector<int32_t> order_;
  std::vector<float> scores_;
  std::vector<float> choice_;
  std::vector<float> group_score_;
  std::vector<int32_t> group_order_;
};

}  // namespace

int MoeRoute(const MoeRouteParams& p, ThreadPool* /*pool*/) {
  if (const int status = CheckMoeRouteParams(p); status != kKernelOk) return status;
  const int64_t n = p.n_rows;
  const int64_t k = p.top_k;
  const int64_t stride = p.logit_stride ? p.logit_stride : p.experts + (p.shared_gate ? 1 : 0);
  std::vector<int32_t> choice(static_cast<size_t>(n * k));
  std::vector<float> choice_weight(static_cast<size_t>(n * k));
  RowRouter router(p);
  for (int64_t r = 0; r < n; ++r) router.Choose(p.logits + r * stride, &choice[r * k], &choice_weight[r * k]);

  std::vector<int64_t> next(static_cast<size_t>(p.experts) + 1, 0);
  for (int32_t e : choice) ++next[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < p.experts; ++e) next[static_cast<size_t>(e) + 1] += next[static_cast<size_t>(e)];
  for (int64_t e = 0; e <= p.experts; ++e) p.offsets[e] = static_cast<int32_t>(next[static_cast<size_t>(e)]);
  // Rows ascending within each expert; each row's slots in ascending expert
  // order, which is ascending position.
  for (int64_t r = 0; r < n; ++r) {
    int32_t* slots = p.slots + r * k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = next[static_cast<size_t>(choice[static_cast<size_t>(r * k + j)])]++;
      p.rows[at] = static_cast<int32_t>(r);
      p.weights[at] = choice_weight[static_cast<size_t>(r * k + j)];
      slots[j] = static_cast<int32_t>(at);
    }
    std::sort(slots, slots + k);
  }
  if (p.shared_gate) {
    // The shared expert's gate: sigmoid of the router's last column (torch: 1 / (1 + exp(-x))).
    for (int64_t r = 0; r < n; ++r) {
      p.rows[n * k + r] = static_cast<int32_t>(r);
      p.weights[n * k + r] = 1.0f / (1.0f + std::exp(-p.logits[r * stride + p.experts]));
    }
  }
  return kKernelOk;
}

int ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count, MatmulMode mode,
                 ThreadPool* pool) {
  if (const int status = CheckExpertMatmulParams(p); status != kKernelOk) return status;
  if (also_count < 0 || (also_count > 0 && also == nullptr)) return kKernelInvalidArgument;
  if (p.offsets[0] != 0) return kKernelInvalidArgument;
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t count = static_cast<int64_t>(p.offsets[e + 1]) - p.offsets[e];
    if (count < 0 || count > p.max_rows) return kKernelInvalidArgument;
  }
  if (p.offsets[p.experts] > p.rows) return kKernelInvalidArgument;
  thread_local std::vector<MatmulParams> items;
  items.clear();
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t first = p.offsets[e];
    const int64_t count = p.offsets[e + 1] - first;
    if (count > 0) items.push_back(ExpertMatmulItem(p, e, first, count));
  }
  items.insert(items.end(), also, also + also_count);
  return MatmulBatch(items.data(), static_cast<int64_t>(items.size()), mode, pool);
}

int MoeCombine(const MoeCombineParams& p, ThreadPool* pool) {
  if (const int status = CheckMoeCombineParams(p); status != kKernelOk) return status;
  if (p.n_rows == 0 || p.per_row == 0 || p.dim == 0) return kKernelOk;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ParallelForRows(pool, p.n_rows, p.dim * p.per_row, [&](int64_t r) {
    float* out = p.out + r * os;
    for (int64_t j = 0; j < p.per_row; ++j) {
      const int64_t s = p.slots[r * p.per_row + j];
      const float* x = p.x + s * xs;
      const float w = p.weights[s];
      // Built with -ffp-contract=off: ScatterAddRows' roundings (alpha 1 is exact).
      for (int64_t c = 0; c < p.dim; ++c) out[c] = out[c] + x[c] * w;
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
