#include "kernels/cpu/qwen_moe_block.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/torch_topk.h"

namespace hybridserve::kernels::cpu {
namespace {

// y[o] = sum_i w[o, i] * x[i], summed in ascending i (fp32).
void MatVec(const float* w, const float* x, int64_t rows, int64_t cols, float* y) {
  for (int64_t o = 0; o < rows; ++o) {
    const float* wr = w + o * cols;
    float acc = 0.0f;
    for (int64_t i = 0; i < cols; ++i) acc += wr[i] * x[i];
    y[o] = acc;
  }
}

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// out [hidden] = down(silu(gate x) * up x) for gate, up [inter, hidden],
// down [hidden, inter]; h [inter] and u [inter] are scratch.
void SwiGlu(const float* gate, const float* up, const float* down, const float* x, int64_t hidden, int64_t inter,
            float* h, float* u, float* out) {
  MatVec(gate, x, inter, hidden, h);
  MatVec(up, x, inter, hidden, u);
  for (int64_t i = 0; i < inter; ++i) h[i] = h[i] * Sigmoid(h[i]) * u[i];
  MatVec(down, h, hidden, inter, out);
}

KernelStatus Fail(const char* field, const char** bad_field) {
  if (bad_field != nullptr) *bad_field = field;
  return kKernelInvalidArgument;
}

}  // namespace

KernelStatus CheckQwenMoeBlockShape(const QwenMoeBlockShape& s, const QwenMoeBlockWeights& w, const char** bad_field) {
  if (s.hidden <= 0) return Fail("hidden", bad_field);
  if (s.num_experts <= 0) return Fail("num_experts", bad_field);
  if (s.top_k <= 0 || s.top_k > s.num_experts) return Fail("top_k", bad_field);
  if (s.moe_intermediate <= 0) return Fail("moe_intermediate", bad_field);
  if (s.shared_intermediate <= 0) return Fail("shared_intermediate", bad_field);
  if (w.router == nullptr) return Fail("router", bad_field);
  if (w.experts_gate_up == nullptr) return Fail("experts_gate_up", bad_field);
  if (w.experts_down == nullptr) return Fail("experts_down", bad_field);
  if (w.shared_gate_proj == nullptr) return Fail("shared_gate_proj", bad_field);
  if (w.shared_up_proj == nullptr) return Fail("shared_up_proj", bad_field);
  if (w.shared_down_proj == nullptr) return Fail("shared_down_proj", bad_field);
  if (w.shared_expert_gate == nullptr) return Fail("shared_expert_gate", bad_field);
  return kKernelOk;
}

KernelStatus QwenMoeBlockForward(const QwenMoeBlockShape& s, const QwenMoeBlockWeights& w, const float* x, int64_t n,
                                 float* y, int32_t* chosen, float* chosen_weight, const char** bad_field) {
  if (const KernelStatus st = CheckQwenMoeBlockShape(s, w, bad_field); st != kKernelOk) return st;
  if (n < 0) return Fail("n", bad_field);
  if (n == 0) return kKernelOk;
  if (x == nullptr) return Fail("x", bad_field);
  if (y == nullptr) return Fail("y", bad_field);
  if (y == x) return Fail("y", bad_field);

  const int64_t hidden = s.hidden;
  const int64_t experts = s.num_experts;
  const int64_t k = s.top_k;
  const int64_t inter = s.moe_intermediate;
  const int64_t widest = std::max(inter, s.shared_intermediate);
  std::vector<float> p(experts), h(widest), u(widest), out(hidden), routed(hidden);
  std::vector<float> weight(experts);
  std::vector<char> is_chosen(experts);
  std::vector<int32_t> order(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * hidden;
    float* yr = y + r * hidden;
    // Router: softmax over every expert, then the top k (torch's choice among ties).
    MatVec(w.router, xr, experts, hidden, p.data());
    const float top = *std::max_element(p.begin(), p.end());
    float total = 0.0f;
    for (float& v : p) {
      v = std::exp(v - top);
      total += v;
    }
    for (float& v : p) v /= total;
    TorchTopKIndices(p.data(), experts, k, order.data());
    float chosen_total = 0.0f;
    for (int64_t j = 0; j < k; ++j) chosen_total += p[order[j]];
    std::fill(is_chosen.begin(), is_chosen.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const float wj = s.norm_topk_prob ? p[e] / chosen_total : p[e];
      is_chosen[e] = 1;
      weight[e] = wj;
      if (chosen != nullptr) chosen[r * k + j] = static_cast<int32_t>(e);
      if (chosen_weight != nullptr) chosen_weight[r * k + j] = wj;
    }
    // Routed experts, summed in ascending expert order from zero (index_add_ per expert).
    std::fill(routed.begin(), routed.end(), 0.0f);
    for (int64_t e = 0; e < experts; ++e) {
      if (!is_chosen[e]) continue;
      const float* gate_up = w.experts_gate_up + e * 2 * inter * hidden;
      SwiGlu(gate_up, gate_up + inter * hidden, w.experts_down + e * hidden * inter, xr, hidden, inter, h.data(),
             u.data(), out.data());
      for (int64_t i = 0; i < hidden; ++i) routed[i] += out[i] * weight[e];
    }
    // The shared expert, scaled by its sigmoid gate.
    SwiGlu(w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, xr, hidden, s.shared_intermediate, h.data(),
           u.data(), out.data());
    float g = 0.0f;
    MatVec(w.shared_expert_gate, xr, 1, hidden, &g);
    const float gate = Sigmoid(g);
    for (int64_t i = 0; i < hidden; ++i) yr[i] = routed[i] + gate * out[i];
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
