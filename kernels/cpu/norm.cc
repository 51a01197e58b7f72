#include "kernels/cpu/norm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

float InverseRms(float sum_sq, int64_t n, float eps) { return 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps); }

template <typename Fn>
void ForRows(ThreadPool* pool, int64_t n_rows, int64_t dim, Fn row_fn) {
  const int64_t tasks = std::max<int64_t>(1, std::min(n_rows, n_rows * dim / 16384));
  ParallelFor(pool, tasks, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin * n_rows / tasks; r < end * n_rows / tasks; ++r) row_fn(r);
  });
}

}  // namespace

int RmsNorm(const RmsNormParams& p, ThreadPool* pool) {
  if (const int status = CheckRmsNormParams(p); status != kKernelOk) return status;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* x = p.x + r * xs;
    float* out = p.out + r * os;
    const float inv = InverseRms(simd::SumOfSquares(x, p.dim), p.dim, p.eps);
    if (p.weight != nullptr) {
      for (int64_t i = 0; i < p.dim; ++i) out[i] = (x[i] * inv) * p.weight[i];
    } else {
      for (int64_t i = 0; i < p.dim; ++i) out[i] = x[i] * inv;
    }
  });
  return kKernelOk;
}

int GatedRmsNorm(const GatedRmsNormParams& p, ThreadPool* pool) {
  if (const int status = CheckGatedRmsNormParams(p); status != kKernelOk) return status;
  const int64_t gs = p.group_size ? p.group_size : p.dim;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t zs = p.z_row_stride ? p.z_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* x = p.x + r * xs;
    const float* z = p.z ? p.z + r * zs : nullptr;
    float* out = p.out + r * os;
    for (int64_t g0 = 0; g0 < p.dim; g0 += gs) {
      if (z != nullptr && !p.norm_before_gate) {
        // out may alias x exactly: element i is read before it is written.
        for (int64_t i = g0; i < g0 + gs; ++i) out[i] = x[i] * Silu(z[i]);
        const float inv = InverseRms(simd::SumOfSquares(out + g0, gs), gs, p.eps);
        for (int64_t i = g0; i < g0 + gs; ++i) {
          out[i] = p.weight ? (out[i] * inv) * p.weight[i] : out[i] * inv;
        }
      } else {
        const float inv = InverseRms(simd::SumOfSquares(x + g0, gs), gs, p.eps);
        for (int64_t i = g0; i < g0 + gs; ++i) {
          float v = p.weight ? (x[i] * inv) * p.weight[i] : x[i] * inv;
          if (z != nullptr) v = v * Silu(z[i]);
          out[i] = v;
        }
      }
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
