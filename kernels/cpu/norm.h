#ifndef HYBRIDSERVE_KERNELS_CPU_NORM_H_
#define HYBRIDSERVE_KERNELS_CPU_NORM_H_

#include "kernels/cpu/thread_pool.h"
#include "kernels/norm_params.h"

namespace hybridserve::kernels::cpu {

// RMSNorm and Mamba2's gated grouped RMSNorm (see kernels/norm_params.h).
// The sum of squares of a row (or group) is accumulated in 8 fp32 lanes
// (element i in lane i % 8, tail lanes zero) and reduced in a fixed tree, so a
// row's bits never depend on other rows or threads. Return a KernelStatus.
int RmsNorm(const RmsNormParams& p, ThreadPool* pool);
int GatedRmsNorm(const GatedRmsNormParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_NORM_H_
