#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

int Rope(const RopeParams& p, ThreadPool* pool) {
  if (const int status = CheckRopeParams(p); status != kKernelOk) return status;
  const int64_t rot = p.rotary_dim ? p.rotary_dim : p.head_dim;
  const int64_t half = rot / 2;
  const int64_t xs = p.x_token_stride ? p.x_token_stride : p.n_heads * p.head_dim;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(p.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
  }
  ParallelFor(pool, p.n_tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = begin; t < end; ++t) {
      const double pos = static_cast<double>(p.positions ? p.positions[t] : p.start_pos + t);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * inv_freq[i];
        cos_v[i] = static_cast<float>(std::cos(angle));
        sin_v[i] = static_cast<float>(std::sin(angle));
      }
      for (int64_t h = 0; h < p.n_heads; ++h) {
        float* x = p.x + t * xs + h * p.head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i];
          const float x2 = x[i + half];
          x[i] = x1 * cos_v[i] - x2 * sin_v[i];
          x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
        }
      }
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
