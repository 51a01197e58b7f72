#ifndef HYBRIDSERVE_KERNELS_MATMUL_PARAMS_H_
#define HYBRIDSERVE_KERNELS_MATMUL_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// out = a @ w^T (+ bias) (+ out), the Hugging Face nn.Linear layout:
//   out[i, j] = sum_k a[i, k] * w[j, k]
// Exactly one of w (fp32) and w_bf16 (bfloat16 bit patterns, the high 16 bits of
// an fp32) is set; bf16 weights are widened exactly to fp32 on the fly.
struct MatmulParams {
  const float* a = nullptr;          // [m, k], row stride lda
  const float* w = nullptr;          // [n, k], row stride ldw
  const uint16_t* w_bf16 = nullptr;  // [n, k], row stride ldw
  const float* bias = nullptr;       // [n]; null: no bias
  float* out = nullptr;              // [m, n], row stride ldo; must not alias a or w
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t lda = 0;  // 0: k
  int64_t ldw = 0;  // 0: k
  int64_t ldo = 0;  // 0: n
  // out = out + (a @ w^T + bias) instead of out = a @ w^T + bias (residual add).
  bool accumulate = false;
};

// The argument checks every backend makes before the kernel runs:
// kKernelInvalidArgument for a null a or out, not exactly one of w and w_bf16,
// a negative shape, or a resolved leading dimension shorter than its row.
inline KernelStatus CheckMatmulParams(const MatmulParams& p) {
  if (p.a == nullptr || p.out == nullptr || (p.w == nullptr) == (p.w_bf16 == nullptr) || p.m < 0 || p.n < 0 ||
      p.k < 0) {
    return kKernelInvalidArgument;
  }
  const int64_t lda = p.lda ? p.lda : p.k;
  const int64_t ldw = p.ldw ? p.ldw : p.k;
  const int64_t ldo = p.ldo ? p.ldo : p.n;
  if (lda < p.k || ldw < p.k || ldo < p.n) return kKernelInvalidArgument;
  return kKernelOk;
}

enum class MatmulMode : int {
  // Each out[i, j] is computed with one fixed reduction order over k that does
  // not depend on m, on the other rows of the call, on blocking or on the thread
  // count: a row's bits depend only on that row of a and on w.
  kDeterministic = 0,
  // Fastest available library path (OpenBLAS on CPU); rows may differ in the
  // last bits depending on m and threads.
  kFast = 1,
};

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_MATMUL_PARAMS_H_
