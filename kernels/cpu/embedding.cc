#include "kernels/cpu/embedding.h"

#include <cstdint>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

int Embedding(const EmbeddingParams& p, ThreadPool* pool) {
  if (const int status = CheckEmbeddingParams(p); status != kKernelOk) return status;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    if (p.tokens[t] < 0 || p.tokens[t] >= p.vocab) return kKernelInvalidArgument;
  }
  const size_t row_bytes = static_cast<size_t>(p.dim) * sizeof(float);
  ParallelFor(pool, p.n_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = static_cast<int64_t>(p.tokens[t]) * p.dim;
      if (p.table != nullptr) {
        std::memcpy(p.out + t * p.dim, p.table + row, row_bytes);
        continue;
      }
      float* out = p.out + t * p.dim;
      for (int64_t i = 0; i < p.dim; ++i) out[i] = Bf16ToFloat(p.table_bf16[row + i]);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
