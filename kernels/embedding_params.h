#ifndef HYBRIDSERVE_KERNELS_EMBEDDING_PARAMS_H_
#define HYBRIDSERVE_KERNELS_EMBEDDING_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// Row gather: out[t] = table[tokens[t]] for t < n_tokens (an exact copy; bf16
// rows widened exactly). Exactly one of table and table_bf16 is set.
struct EmbeddingParams {
  const float* table = nullptr;          // [vocab, dim]
  const uint16_t* table_bf16 = nullptr;  // [vocab, dim], bfloat16 bit patterns
  const int32_t* tokens = nullptr;       // [n_tokens], each in [0, vocab)
  float* out = nullptr;                  // [n_tokens, dim]; must not alias table
  int64_t n_tokens = 0;
  int64_t vocab = 0;
  int64_t dim = 0;
};

// The checks of the host-visible fields every backend makes before the kernel
// runs: kKernelInvalidArgument unless exactly one table is set, tokens and out
// are set and n_tokens, vocab and dim are >= 1. The token ids are device
// memory: each backend checks them its own way (kernels/cpu and kernels/cuda).
inline KernelStatus CheckEmbeddingParams(const EmbeddingParams& p) {
  if ((p.table == nullptr) == (p.table_bf16 == nullptr) || p.tokens == nullptr || p.out == nullptr || p.n_tokens < 1 ||
      p.vocab < 1 || p.dim < 1) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_EMBEDDING_PARAMS_H_
