#ifndef HYBRIDSERVE_KERNELS_CPU_ROPE_H_
#define HYBRIDSERVE_KERNELS_CPU_ROPE_H_

#include "kernels/attention_params.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {

// Rotary position embedding, rotate-half convention, in place (see RopeParams).
// cos/sin come from the angle computed in double, so a position's rotation has
// the same bits in prefill and decode. Returns a KernelStatus.
int Rope(const RopeParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_ROPE_H_
