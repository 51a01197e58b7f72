#include "kernels/cpu/gated_attention_layer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/cpu/attention_reference.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/norm_params.h"

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

KernelStatus Fail(const char* field, const char** bad_field) {
  if (bad_field != nullptr) *bad_field = field;
  return kKernelInvalidArgument;
}

// Zero-centred RMSNorm of n_rows rows of head_dim in place: scale 1 + w.
KernelStatus ZeroCentredNorm(float* x, int64_t n_rows, int64_t head_dim, const float* w, float eps) {
  std::vector<float> scale(head_dim);
  for (int64_t i = 0; i < head_dim; ++i) scale[i] = 1.0f + w[i];
  RmsNormParams p;
  p.x = x;
  p.out = x;
  p.weight = scale.data();
  p.n_rows = n_rows;
  p.dim = head_dim;
  p.eps = eps;
  return static_cast<KernelStatus>(RmsNorm(p, nullptr));
}

KernelStatus Rotate(const GatedAttentionLayerShape& s, float* x, int64_t n, int64_t heads, int64_t start_pos) {
  RopeParams p;
  p.x = x;
  p.start_pos = start_pos;
  p.n_tokens = n;
  p.n_heads = heads;
  p.head_dim = s.head_dim;
  p.rotary_dim = s.rotary_dim;
  p.theta = s.theta;
  return static_cast<KernelStatus>(Rope(p, nullptr));
}

}  // namespace

KernelStatus CheckGatedAttentionLayerShape(const GatedAttentionLayerShape& s, const GatedAttentionLayerWeights& w,
                                           const char** bad_field) {
  const int64_t rot = s.rotary_dim ? s.rotary_dim : s.head_dim;
  if (s.hidden <= 0) return Fail("hidden", bad_field);
  if (s.n_kv_heads <= 0) return Fail("n_kv_heads", bad_field);
  if (s.n_heads <= 0 || s.n_heads % s.n_kv_heads != 0) return Fail("n_heads", bad_field);
  if (s.head_dim <= 0) return Fail("head_dim", bad_field);
  if (rot <= 0 || rot % 2 != 0 || rot > s.head_dim) return Fail("rotary_dim", bad_field);
  if (!(s.theta > 0.0)) return Fail("theta", bad_field);
  if (!(s.eps >= 0.0f)) return Fail("eps", bad_field);
  if (w.q_proj == nullptr) return Fail("q_proj", bad_field);
  if (w.k_proj == nullptr) return Fail("k_proj", bad_field);
  if (w.v_proj == nullptr) return Fail("v_proj", bad_field);
  if (w.o_proj == nullptr) return Fail("o_proj", bad_field);
  if (w.q_norm == nullptr) return Fail("q_norm", bad_field);
  if (w.k_norm == nullptr) return Fail("k_norm", bad_field);
  return kKernelOk;
}

KernelStatus GatedAttentionLayerForward(const GatedAttentionLayerShape& s, const GatedAttentionLayerWeights& w,
                                        const float* x, int64_t n, int64_t start_pos, float* k_cache, float* v_cache,
                                        float* y, const char** bad_field) {
  if (const KernelStatus st = CheckGatedAttentionLayerShape(s, w, bad_field); st != kKernelOk) return st;
  if (n < 0) return Fail("n", bad_field);
  if (start_pos < 0) return Fail("start_pos", bad_field);
  if (n == 0) return kKernelOk;
  if (x == nullptr) return Fail("x", bad_field);
  if (k_cache == nullptr) return Fail("k_cache", bad_field);
  if (v_cache == nullptr) return Fail("v_cache", bad_field);
  if (y == nullptr) return Fail("y", bad_field);

  const int64_t hd = s.head_dim;
  const int64_t q_dim = s.n_heads * hd;
  const int64_t kv_dim = s.n_kv_heads * hd;
  std::vector<float> qg(2 * q_dim), q(n * q_dim), gate(n * q_dim);
  float* k_new = k_cache + start_pos * kv_dim;
  float* v_new = v_cache + start_pos * kv_dim;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * s.hidden;
    MatVec(w.q_proj, xt, 2 * q_dim, s.hidden, qg.data());
    for (int64_t h = 0; h < s.n_heads; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        q[t * q_dim + h * hd + d] = qg[h * 2 * hd + d];
        gate[t * q_dim + h * hd + d] = qg[h * 2 * hd + hd + d];
      }
    }
    MatVec(w.k_proj, xt, kv_dim, s.hidden, k_new + t * kv_dim);
    MatVec(w.v_proj, xt, kv_dim, s.hidden, v_new + t * kv_dim);
  }
  KernelStatus st = ZeroCentredNorm(q.data(), n * s.n_heads, hd, w.q_norm, s.eps);
  if (st == kKernelOk) st = ZeroCentredNorm(k_new, n * s.n_kv_heads, hd, w.k_norm, s.eps);
  if (st == kKernelOk) st = Rotate(s, q.data(), n, s.n_heads, start_pos);
  if (st == kKernelOk) st = Rotate(s, k_new, n, s.n_kv_heads, start_pos);
  if (st != kKernelOk) return st;

  const int64_t n_keys = start_pos + n;
  const std::vector<float> keys(k_cache, k_cache + n_keys * kv_dim), values(v_cache, v_cache + n_keys * kv_dim);
  const std::vector<double> attn = reference::CausalAttention(q, keys, values, start_pos, n, s.n_heads, s.n_kv_heads,
                                                              hd, 1.0 / std::sqrt(static_cast<double>(hd)));
  std::vector<float> o(q_dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < q_dim; ++i) {
      const float g = gate[t * q_dim + i];
      o[i] = static_cast<float>(attn[t * q_dim + i]) * (1.0f / (1.0f + std::exp(-g)));
    }
    MatVec(w.o_proj, o.data(), s.hidden, q_dim, y + t * s.hidden);
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
