#include "kernels/cpu/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hybridserve::kernels::cpu::reference {

std::vector<double> CausalAttention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int64_t q_start, int64_t n_q, int64_t n_heads,
                                    int64_t n_kv_heads, int64_t head_dim, double scale) {
  const int64_t D = head_dim;
  const int64_t group = n_heads / n_kv_heads;
  std::vector<double> out(n_q * n_heads * D, 0.0);
  for (int64_t t = 0; t < n_q; ++t) {
    const int64_t n_keys = q_start + t + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const float* qv = q.data() + (t * n_heads + h) * D;
      std::vector<double> s(n_keys);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kv = k.data() + (j * n_kv_heads + kvh) * D;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * kv[d];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        s[j] = std::exp(s[j] - m);
        l += s[j];
      }
      double* o = out.data() + (t * n_heads + h) * D;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vv = v.data() + (j * n_kv_heads + kvh) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += s[j] / l * vv[d];
      }
    }
  }
  return out;
}

}  // namespace hybridserve::kernels::cpu::reference
