#ifndef HYBRIDSERVE_KERNELS_CPU_EMBEDDING_H_
#define HYBRIDSERVE_KERNELS_CPU_EMBEDDING_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/embedding_params.h"

namespace hybridserve::kernels::cpu {

// out[t] = table[tokens[t]]; see kernels/embedding_params.h. Returns a KernelStatus:
// kKernelInvalidArgument (nothing written) for a null pointer, a non-positive
// size or a token outside [0, vocab).
int Embedding(const EmbeddingParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_EMBEDDING_H_
