#ifndef HYBRIDSERVE_KERNELS_CPU_MOE_H_
#define HYBRIDSERVE_KERNELS_CPU_MOE_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul_params.h"
#include "kernels/moe_params.h"

namespace hybridserve::kernels::cpu {

// A mixture-of-experts block's routing, expert projections and combine
// (kernels/moe_params.h): the reference the CUDA kernels are compared with.
// Each returns a KernelStatus; kKernelInvalidArgument (nothing written) when
// the params' check fails. pool may be null (runs on the caller).
//
// MoeRoute chooses each row's experts on the caller's thread (routing is a
// few hundred operations a row); kSoftmaxTopK breaks exact ties as
// torch.topk does on the CPU (kernels/torch_topk.h).
int MoeRoute(const MoeRouteParams& p, ThreadPool* pool);
// The experts' items (one per expert with rows) and `also` in one MatmulBatch:
// each gets the bits of its own Matmul in `mode`. Checks the offsets (host
// memory on this backend) before anything runs.
int ExpertMatmul(const ExpertMatmulParams& p, const MatmulParams* also, int64_t also_count, MatmulMode mode,
                 ThreadPool* pool);
int MoeCombine(const MoeCombineParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_MOE_H_
