#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels/cuda/vector_add.h"

namespace hybridserve::kernels::cuda {
namespace {

__global__ void VectorAddKernel(const float* a, const float* b, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

int DeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) return count;
  cudaGetLastError();  // clear the sticky error
  // No device, or no driver at all: a machine without a GPU.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return 0;
  return -static_cast<int>(err);  // a broken GPU setup is an error, not "no GPU"
}

int NcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

int VectorAdd(const VectorAddParams& p) {
  if (p.n <= 0) return 0;
  const size_t bytes = static_cast<size_t>(p.n) * sizeof(float);
  float *a = nullptr, *b = nullptr, *out = nullptr;
  cudaError_t err = cudaMalloc(&a, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&b, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&out, bytes);
  if (err == cudaSuccess) err = cudaMemcpy(a, p.a, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(b, p.b, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    constexpr int kThreads = 256;
    const int blocks = static_cast<int>((p.n + kThreads - 1) / kThreads);
    VectorAddKernel<<<blocks, kThreads>>>(a, b, out, p.n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(p.out, out, bytes, cudaMemcpyDeviceToHost);
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
  return static_cast<int>(err);
}

}  // namespace hybridserve::kernels::cuda
