#include "kernels/cpu/activations.h"

#include <algorithm>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Rows per parallel task: elementwise work is cheap, keep tasks coarse.
int64_t RowTasks(int64_t n_rows, int64_t dim) {
  const int64_t kMinElementsPerTask = 16384;
  return std::max<int64_t>(1, std::min(n_rows, n_rows * dim / kMinElementsPerTask));
}

template <typename Fn>
void ForRows(ThreadPool* pool, int64_t n_rows, int64_t dim, Fn row_fn) {
  const int64_t tasks = RowTasks(n_rows, dim);
  ParallelFor(pool, tasks, [&](int64_t begin, int64_t end) {
    const int64_t r0 = begin * n_rows / tasks;
    const int64_t r1 = end * n_rows / tasks;
    for (int64_t r = r0; r < r1; ++r) row_fn(r);
  });
}

}  // namespace

int Activation(const ActivationParams& p, ThreadPool* pool) {
  if (const int status = CheckActivationParams(p); status != kKernelOk) return status;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* x = p.x + r * xs;
    float* out = p.out + r * os;
    switch (p.kind) {
      case ActivationKind::kSilu:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Silu(x[i]);
        break;
      case ActivationKind::kReluSquared:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = ReluSquared(x[i]);
        break;
      case ActivationKind::kSoftplus:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Softplus(x[i]);
        break;
    }
  });
  return kKernelOk;
}

int SwiGlu(const SwiGluParams& p, ThreadPool* pool) {
  if (const int status = CheckSwiGluParams(p); status != kKernelOk) return status;
  const int64_t gs = p.gate_row_stride ? p.gate_row_stride : p.dim;
  const int64_t us = p.up_row_stride ? p.up_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* g = p.gate + r * gs;
    const float* u = p.up + r * us;
    float* out = p.out + r * os;
    for (int64_t i = 0; i < p.dim; ++i) out[i] = Silu(g[i]) * u[i];
  });
  return kKernelOk;
}

int DtSoftplus(const DtSoftplusParams& p, ThreadPool* pool) {
  if (const int status = CheckDtSoftplusParams(p); status != kKernelOk) return status;
  const int64_t rs = p.dt_raw_row_stride ? p.dt_raw_row_stride : p.n_heads;
  const int64_t ds = p.dt_row_stride ? p.dt_row_stride : p.n_heads;
  ForRows(pool, p.n_tokens, p.n_heads, [&](int64_t t) {
    const float* raw = p.dt_raw + t * rs;
    float* dt = p.dt + t * ds;
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const float v = Softplus(p.dt_bias ? raw[h] + p.dt_bias[h] : raw[h]);
      dt[h] = std::min(std::max(v, p.dt_min), p.dt_max);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
