#ifndef HYBRIDSERVE_KERNELS_CUDA_EMU_EMU_TEST_KERNELS_H_
#define HYBRIDSERVE_KERNELS_CUDA_EMU_EMU_TEST_KERNELS_H_

// What the emulator's tests share: launch helpers, a device buffer, and the
// toy kernels more than one of them runs (a shared-memory tree reduction, a
// round of warp shuffles). Test-only.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emu/cuda_emu.h"

namespace hybridserve::kernels::cuda_emu::test_kernels {

inline constexpr unsigned int kFull = 0xffffffffu;

template <typename F>
const void* Id(F* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

inline unsigned int LinearThread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned int LinearBlock() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
inline unsigned int BlockThreads() { return blockDim.x * blockDim.y * blockDim.z; }

// Device buffer of `count` T; copies back with Read().
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)), cudaSuccess);
  }
  ~DeviceBuffer() { EXPECT_EQ(cudaFree(ptr_), cudaSuccess); }
  T* get() const { return ptr_; }
  std::vector<T> Read() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void Write(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), count_);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }

 private:
  size_t count_;
  T* ptr_ = nullptr;
};

// out[block] = sum of in[block * 256 .. +256), by a tree over shared memory.
inline void BlockReduceKernel(const int64_t* in, int64_t* out) {
  __shared__ int64_t partial[256];
  const unsigned int t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

struct ShuffleOut {
  int32_t xor5[64];
  int32_t down3[64];
  int32_t up2[64];
  int32_t idx[64];
  int32_t xor1_width8[64];
  int32_t down1_width8[64];
  int32_t up3_width16[64];
  int32_t idx_width8[64];
  int64_t wide[64];
  float sum[64];
};

inline void ShuffleKernel(ShuffleOut* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t % 32;
  // Back-to-back collectives with different values: a lane that reads late
  // must still see its exchange's values.
  out->xor5[t] = __shfl_xor_sync(kFull, t * 10, 5);
  out->down3[t] = __shfl_down_sync(kFull, t * 10 + 1, 3);
  out->up2[t] = __shfl_up_sync(kFull, t * 10 + 2, 2);
  out->idx[t] = __shfl_sync(kFull, t * 10 + 3, (lane * 7) % 32);
  out->xor1_width8[t] = __shfl_xor_sync(kFull, t * 10 + 4, 1, 8);
  out->down1_width8[t] = __shfl_down_sync(kFull, t * 10 + 5, 1, 8);
  out->up3_width16[t] = __shfl_up_sync(kFull, t * 10 + 6, 3, 16);
  out->idx_width8[t] = __shfl_sync(kFull, t * 10 + 7, 2, 8);
  out->wide[t] = __shfl_xor_sync(kFull, (int64_t{t} << 40) + 9, 16);
  float v = static_cast<float>(lane);
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  out->sum[t] = v;
}

}  // namespace hybridserve::kernels::cuda_emu::test_kernels

#endif  // HYBRIDSERVE_KERNELS_CUDA_EMU_EMU_TEST_KERNELS_H_
