#include "kernels/cpu/rows.h"

#include <cstdint>
#include <cstring>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

int GatherRows(const GatherRowsParams& p, ThreadPool* pool) {
  if (const int status = CheckGatherRowsParams(p); status != kKernelOk) return status;
  if (p.n_rows == 0 || p.dim == 0) return kKernelOk;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  const size_t row_bytes = static_cast<size_t>(p.dim) * sizeof(float);
  ParallelForRows(pool, p.n_rows, p.dim, [&](int64_t i) {
    std::memcpy(p.out + i * os, p.x + static_cast<int64_t>(p.index[i]) * xs, row_bytes);
  });
  return kKernelOk;
}

int ScatterAddRows(const ScatterAddRowsParams& p, ThreadPool* pool) {
  if (const int status = CheckScatterAddRowsParams(p); status != kKernelOk) return status;
  if (p.n_rows == 0 || p.dim == 0) return kKernelOk;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  const float alpha = p.alpha;
  ParallelForRows(pool, p.n_rows, p.dim, [&](int64_t i) {
    const float* x = p.x + i * xs;
    float* out = p.out + (p.index != nullptr ? static_cast<int64_t>(p.index[i]) : i) * os;
    const float w = p.weight != nullptr ? p.weight[i] : 1.0f;
    // Built with -ffp-contract=off: three roundings, in this order.
    for (int64_t j = 0; j < p.dim; ++j) out[j] = out[j] + (x[j] * w) * alpha;
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
