#ifndef HYBRIDSERVE_KERNELS_CPU_CONV1D_H_
#define HYBRIDSERVE_KERNELS_CPU_CONV1D_H_

#include "kernels/conv1d_params.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {

// Causal depthwise conv1d (see kernels/conv1d_params.h). Both forms compute
// every output element as bias, then fused multiply-adds for k = 0 .. d_conv-1,
// then SiLU (activations.h): the prefill form gives the same bits for any split
// of a sequence, and the update form the bits of the prefill form's last row.
// Work is partitioned over channels. Return a KernelStatus.
int CausalConv1d(const CausalConv1dParams& p, ThreadPool* pool);
int CausalConv1dUpdate(const CausalConv1dUpdateParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_CONV1D_H_
