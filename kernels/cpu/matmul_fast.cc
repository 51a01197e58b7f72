// Fast matmul mode on OpenBLAS, and the mode dispatcher.

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Rows of bf16 w widened per OpenBLAS call.
constexpr int64_t kBf16RowsPerBlock = 256;

// out[:, 0:n] = a @ w^T + beta * out (fp32 w).
void Gemm(const float* a, int64_t lda, const float* w, int64_t ldw, float* out, int64_t ldo, int64_t m, int64_t n,
          int64_t k, float beta) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w, static_cast<int>(ldw),
                a, 1, beta, out, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                1.0f, a, static_cast<int>(lda), w, static_cast<int>(ldw), beta, out, static_cast<int>(ldo));
  }
}

}  // namespace

int MatmulFast(const MatmulParams& p, ThreadPool* /*pool*/) {
  if (const int status = CheckMatmulParams(p); status != kKernelOk) return status;
  const int64_t lda = p.lda ? p.lda : p.k;
  const int64_t ldw = p.ldw ? p.ldw : p.k;
  const int64_t ldo = p.ldo ? p.ldo : p.n;
  if (p.m == 0 || p.n == 0) return kKernelOk;
  // Fold the bias into the output first and let the GEMM accumulate onto it.
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (p.bias != nullptr) {
    for (int64_t i = 0; i < p.m; ++i) {
      float* out = p.out + i * ldo;
      for (int64_t j = 0; j < p.n; ++j) out[j] = p.accumulate ? out[j] + p.bias[j] : p.bias[j];
    }
    beta = 1.0f;
  }
  if (p.k == 0) {
    if (beta == 0.0f) {
      for (int64_t i = 0; i < p.m; ++i) std::fill(p.out + i * ldo, p.out + i * ldo + p.n, 0.0f);
    }
    return kKernelOk;
  }
  if (p.w != nullptr) {
    Gemm(p.a, lda, p.w, ldw, p.out, ldo, p.m, p.n, p.k, beta);
    return kKernelOk;
  }
  std::vector<float> block(std::min(p.n, kBf16RowsPerBlock) * p.k);
  for (int64_t j0 = 0; j0 < p.n; j0 += kBf16RowsPerBlock) {
    const int64_t rows = std::min(kBf16RowsPerBlock, p.n - j0);
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = p.w_bf16 + (j0 + r) * ldw;
      float* dst = block.data() + r * p.k;
      for (int64_t c = 0; c < p.k; ++c) dst[c] = Bf16ToFloat(src[c]);
    }
    // sgemv writes a contiguous output; for m == 1 the column block is contiguous too.
    Gemm(p.a, lda, block.data(), p.k, p.out + j0, ldo, p.m, rows, p.k, beta);
  }
  return kKernelOk;
}

int Matmul(const MatmulParams& p, MatmulMode mode, ThreadPool* pool) {
  switch (mode) {
    case MatmulMode::kDeterministic:
      return MatmulDeterministic(p, pool);
    case MatmulMode::kFast:
      return MatmulFast(p, pool);
  }
  return kKernelInvalidArgument;
}

int MatmulBatch(const MatmulParams* items, int64_t count, MatmulMode mode, ThreadPool* pool) {
  switch (mode) {
    case MatmulMode::kDeterministic:
      return MatmulDeterministicBatchOnPath(items, count, ActiveKernelPath(), pool);
    case MatmulMode::kFast:
      if (count < 0 || (count > 0 && items == nullptr)) return kKernelInvalidArgument;
      for (int64_t i = 0; i < count; ++i) {
        if (const int status = CheckMatmulParams(items[i]); status != kKernelOk) return status;
      }
      for (int64_t i = 0; i < count; ++i) {
        if (const int status = MatmulFast(items[i], pool); status != kKernelOk) return status;
      }
      return kKernelOk;
  }
  return kKernelInvalidArgument;
}

}  // namespace hybridserve::kernels::cpu
