#ifndef HYBRIDSERVE_KERNELS_CUDA_LAUNCHERS_H_
#define HYBRIDSERVE_KERNELS_CUDA_LAUNCHERS_H_

// Plain C++ declarations of every CUDA kernel launcher (the list is in
// launchers.inc). The same .cu sources are built twice:
//   kernels::cuda      nvcc, runs on the GPU (//kernels/cuda:kernels);
//   kernels::cuda_emu  the host compiler against the CUDA emulator of
//                      kernels/cuda/emu, runs on the CPU (//kernels/cuda:emu_kernels),
//                      so every kernel's logic is tested on machines without a GPU.
// Pointers in params structs are device memory of the build that runs them
// (in the emulation, memory from its emulated cudaMalloc).

#include "kernels/activation_params.h"
#include "kernels/attention_params.h"
#include "kernels/conv1d_params.h"
#include "kernels/cuda/launch_context.h"
#include "kernels/embedding_params.h"
#include "kernels/gated_delta_params.h"
#include "kernels/kernel_status.h"
#include "kernels/matmul_params.h"
#include "kernels/moe_params.h"
#include "kernels/norm_params.h"
#include "kernels/rows_params.h"
#include "kernels/ssd_params.h"

namespace hybridserve::kernels::cuda {
#include "kernels/cuda/launchers.inc"
}  // namespace hybridserve::kernels::cuda

namespace hybridserve::kernels::cuda_emu {
#include "kernels/cuda/launchers.inc"
}  // namespace hybridserve::kernels::cuda_emu

#endif  // HYBRIDSERVE_KERNELS_CUDA_LAUNCHERS_H_
