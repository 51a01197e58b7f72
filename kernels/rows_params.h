#ifndef HYBRIDSERVE_KERNELS_ROWS_PARAMS_H_
#define HYBRIDSERVE_KERNELS_ROWS_PARAMS_H_

// Row gather and scatter-add over an int32 row index: the mixture-of-experts
// dispatch (gather the tokens routed to an expert) and combine (add each
// expert's output, times its routing weight, back into the token's row), and
// the μP residual `residual += multiplier * y`.
//
// Index values live in device memory and are not range-checked by any
// backend: the caller guarantees each lies in [0, rows of the indexed tensor)
// (an out-of-range index reads or writes outside the tensor). The kernels stay
// branch-free in exchange; the router that builds the index owns its range.

#include <cmath>
#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// out[i, :] = x[index[i], :] for i in [0, n_rows): an exact copy.
struct GatherRowsParams {
  const float* x = nullptr;        // [*, dim], row stride x_row_stride; the rows named by index are read
  const int32_t* index = nullptr;  // [n_rows], each in [0, rows of x) (not checked); may repeat
  float* out = nullptr;            // [n_rows, dim], row stride out_row_stride; must not overlap x or index
  int64_t n_rows = 0;
  int64_t dim = 0;
  int64_t x_row_stride = 0;    // 0: dim; else >= dim
  int64_t out_row_stride = 0;  // 0: dim; else >= dim
};

// kKernelInvalidArgument for a negative shape, a stride that is negative or
// below dim (0 stands for dim), or, when n_rows > 0, a null x, index or out.
inline KernelStatus CheckGatherRowsParams(const GatherRowsParams& p) {
  if (p.n_rows < 0 || p.dim < 0 || p.x_row_stride < 0 || p.out_row_stride < 0) return kKernelInvalidArgument;
  if ((p.x_row_stride != 0 && p.x_row_stride < p.dim) || (p.out_row_stride != 0 && p.out_row_stride < p.dim)) {
    return kKernelInvalidArgument;
  }
  if (p.n_rows > 0 && (p.x == nullptr || p.index == nullptr || p.out == nullptr)) return kKernelInvalidArgument;
  return kKernelOk;
}

// For i in [0, n_rows) and j in [0, dim), with r = index ? index[i] : i and
// w = weight ? weight[i] : 1:
//   out[r, j] = out[r, j] + ((x[i, j] * w) * alpha)
// each operation rounded to fp32 in that order, never contracted into an FMA
// (multiplying by w = 1 is exact, so a null weight gives the bits of a weight
// of ones). Every backend gives the same bits.
//
// Precondition: no index value repeats within one call (rows are updated in
// parallel and never race); the caller guarantees it, no backend checks it.
struct ScatterAddRowsParams {
  const float* x = nullptr;        // [n_rows, dim], row stride x_row_stride
  const int32_t* index = nullptr;  // [n_rows], distinct, each in [0, rows of out) (not checked); null: i
  const float* weight = nullptr;   // [n_rows], e.g. routing weights; null: 1
  float* out = nullptr;            // [*, dim], row stride out_row_stride; read and written; overlaps no input
  float alpha = 1.0f;              // finite
  int64_t n_rows = 0;
  int64_t dim = 0;
  int64_t x_row_stride = 0;    // 0: dim; else >= dim
  int64_t out_row_stride = 0;  // 0: dim; else >= dim
};

// kKernelInvalidArgument for a negative shape, a stride that is negative or
// below dim (0 stands for dim), a non-finite alpha, or, when n_rows > 0, a
// null x or out.
inline KernelStatus CheckScatterAddRowsParams(const ScatterAddRowsParams& p) {
  if (p.n_rows < 0 || p.dim < 0 || p.x_row_stride < 0 || p.out_row_stride < 0) return kKernelInvalidArgument;
  if ((p.x_row_stride != 0 && p.x_row_stride < p.dim) || (p.out_row_stride != 0 && p.out_row_stride < p.dim)) {
    return kKernelInvalidArgument;
  }
  if (!std::isfinite(p.alpha)) return kKernelInvalidArgument;
  if (p.n_rows > 0 && (p.x == nullptr || p.out == nullptr)) return kKernelInvalidArgument;
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_ROWS_PARAMS_H_
