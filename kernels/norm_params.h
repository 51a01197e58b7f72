#ifndef HYBRIDSERVE_KERNELS_NORM_PARAMS_H_
#define HYBRIDSERVE_KERNELS_NORM_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// RMSNorm per row: out = x / sqrt(mean(x^2) + eps) * weight (fp32 statistics).
// Rows are independent: a row's bits never depend on the other rows.
struct RmsNormParams {
  const float* x = nullptr;       // [n_rows, dim], row stride x_row_stride
  const float* weight = nullptr;  // [dim]; null: no scale
  float* out = nullptr;           // [n_rows, dim], row stride out_row_stride; may alias x exactly
  int64_t n_rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
  int64_t x_row_stride = 0;    // 0: dim
  int64_t out_row_stride = 0;  // 0: dim
};

// The argument checks every backend makes before the kernel runs:
// kKernelInvalidArgument for a null x or out, a negative n_rows, dim < 1 or
// eps < 0 (or NaN).
inline KernelStatus CheckRmsNormParams(const RmsNormParams& p) {
  if (p.x == nullptr || p.out == nullptr || p.n_rows < 0 || p.dim <= 0 || !(p.eps >= 0.0f)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// Mamba2 gated RMSNorm (HF MambaRMSNormGated / NemotronH), normalized per group
// of group_size consecutive channels:
//   norm_before_gate = false (Mamba2, Nemotron-H):  out = rmsnorm_g(x * silu(z)) * weight
//   norm_before_gate = true:                        out = rmsnorm_g(x) * weight * silu(z)
// z null means no gate (plain grouped RMSNorm).
struct GatedRmsNormParams {
  const float* x = nullptr;       // [n_rows, dim], row stride x_row_stride (the scan output y)
  const float* z = nullptr;       // [n_rows, dim], row stride z_row_stride; null: no gate
  const float* weight = nullptr;  // [dim]; null: no scale
  float* out = nullptr;           // [n_rows, dim], row stride out_row_stride; may alias x exactly
  int64_t n_rows = 0;
  int64_t dim = 0;
  int64_t group_size = 0;  // divides dim; 0: dim (one group)
  float eps = 1e-5f;
  bool norm_before_gate = false;
  int64_t x_row_stride = 0;    // 0: dim
  int64_t z_row_stride = 0;    // 0: dim
  int64_t out_row_stride = 0;  // 0: dim
};

// As CheckRmsNormParams, and kKernelInvalidArgument when the resolved group
// size does not divide dim.
inline KernelStatus CheckGatedRmsNormParams(const GatedRmsNormParams& p) {
  const int64_t gs = p.group_size ? p.group_size : p.dim;
  if (p.x == nullptr || p.out == nullptr || p.n_rows < 0 || p.dim <= 0 || gs <= 0 || p.dim % gs != 0 ||
      !(p.eps >= 0.0f)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_NORM_PARAMS_H_
