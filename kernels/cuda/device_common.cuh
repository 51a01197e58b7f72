#ifndef HYBRIDSERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_
#define HYBRIDSERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_

// Included first by every .cu source. The sources are compiled twice
// (kernels/cuda/launchers.h): by nvcc, where this header brings in the CUDA
// runtime and HS_CUDA_NS is kernels::cuda, and by the host compiler, where it
// brings in the emulator (kernels/cuda/emu/cuda_emu.h) and HS_CUDA_NS is
// kernels::cuda_emu. Kernel code written against what is here (and the
// emulator's list of device functions) builds and runs in both.
//
// Rules for kernel code, so both builds agree:
//   - blocks are a multiple of 32 threads; warp collectives (__shfl_*_sync)
//     are executed by all 32 lanes with the full mask 0xffffffff;
//   - dynamic shared memory through HS_DYNAMIC_SMEM, never `extern __shared__`;
//   - launches through Launch() below, never <<<>>> directly;
//   - bf16 is uint16_t bit patterns converted with Bf16ToFloat/FloatToBf16
//     of kernels/bf16.h (no cuda_bf16.h types in shared code);
//   - fminf/fmaxf and the Min/Max templates, not CUDA's overloaded min/max.

#include <cstdint>
#include <utility>

#include "kernels/bf16.h"
#include "kernels/kernel_status.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define HS_CUDA_NS cuda
#define HS_CUDA_EMULATED 0
#define HS_DYNAMIC_SMEM(type, name)                                 \
  extern __shared__ __align__(16) unsigned char hs_dynamic_smem_[]; \
  type* name = reinterpret_cast<type*>(hs_dynamic_smem_)
#else
#include "kernels/cuda/emu/cuda_emu.h"
#define HS_CUDA_NS cuda_emu
#define HS_CUDA_EMULATED 1
#define HS_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(DynamicSharedMemory())
#endif

namespace hybridserve::kernels::HS_CUDA_NS {

// Launches kernel<<<grid, block, smem, stream>>>(args...) (on the emulator: runs
// it) and returns the launch error.
template <typename... KernelArgs, typename... Args>
cudaError_t Launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes, void* stream,
                   Args... args) {
#if defined(__CUDACC__)
  kernel<<<grid, block, smem_bytes, static_cast<cudaStream_t>(stream)>>>(static_cast<KernelArgs>(args)...);
  return cudaGetLastError();
#else
  return EmuLaunch(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes, static_cast<cudaStream_t>(stream),
                   [=] { kernel(static_cast<KernelArgs>(args)...); });
#endif
}

// kKernelOk, or kKernelDeviceError for a failed launch.
inline int LaunchStatus(cudaError_t error) { return error == cudaSuccess ? kKernelOk : kKernelDeviceError; }

template <typename T>
__host__ __device__ __forceinline__ T Min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
__host__ __device__ __forceinline__ T Max(T a, T b) {
  return a < b ? b : a;
}
__host__ __device__ __forceinline__ int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Sum over the 32 lanes of a warp by xor butterfly (offsets 16, 8, 4, 2, 1):
// a fixed order, every lane gets the same bits.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a whole 1-D block (blockDim.x a multiple of 32, <= 1024): each warp
// by WarpSum, then warp 0 sums the warp totals the same way. Every thread gets
// the same bits, and the order depends only on blockDim.x. `scratch` is >= 32
// floats of shared memory, free for reuse after the call returns.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = WarpSum(t);
  return t;
}

// Records a device-resident index out of range (CudaLaunchContext::error_flag).
__device__ __forceinline__ void ReportBadIndex(int32_t* error_flag) {
  if (error_flag != nullptr) *error_flag = kKernelInvalidArgument;
}

}  // namespace hybridserve::kernels::HS_CUDA_NS

#endif  // HYBRIDSERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_
