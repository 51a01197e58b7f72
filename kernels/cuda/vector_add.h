#ifndef HYBRIDSERVE_KERNELS_CUDA_VECTOR_ADD_H_
#define HYBRIDSERVE_KERNELS_CUDA_VECTOR_ADD_H_

// The smallest CUDA kernel, proving the nvcc -> Bazel -> cudart/NCCL path on
// every build. Plain C++ interface: callers never include CUDA headers.

#include <cstdint>

namespace hybridserve::kernels::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU; the
// negated cudaError_t for any other failure (a GPU machine whose CUDA setup is
// broken), which tests must treat as a failure, not a skip.
int DeviceCount();

// NCCL's version code (e.g. 22703), proving NCCL links; 0 on error.
int NcclVersion();

struct VectorAddParams {
  const float* a = nullptr;  // [n], host memory
  const float* b = nullptr;  // [n], host memory
  float* out = nullptr;      // [n], host memory
  int64_t n = 0;
};

// out = a + b computed on device 0 (copies in and out). Returns 0 on success,
// otherwise a cudaError_t code.
int VectorAdd(const VectorAddParams& params);

}  // namespace hybridserve::kernels::cuda

#endif  // HYBRIDSERVE_KERNELS_CUDA_VECTOR_ADD_H_
