#include "kernels/cuda/emu/cuda_emu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/emu/emu_test_kernels.h"

namespace hybridserve::kernels::cuda_emu {
namespace {

using test_kernels::BlockReduceKernel;
using test_kernels::BlockThreads;
using test_kernels::DeviceBuffer;
using test_kernels::Id;
using test_kernels::kFull;
using test_kernels::LinearBlock;
using test_kernels::LinearThread;
using test_kernels::ShuffleKernel;
using test_kernels::ShuffleOut;

// ---- Indices ----

// out[8 * global thread + k]: threadIdx, blockIdx, blockDim.x*y*z, gridDim.x*y*z.
void IndexKernel(uint32_t* out) {
  uint32_t* o = out + 8 * (LinearBlock() * BlockThreads() + LinearThread());
  o[0] = threadIdx.x;
  o[1] = threadIdx.y;
  o[2] = threadIdx.z;
  o[3] = blockIdx.x;
  o[4] = blockIdx.y;
  o[5] = blockIdx.z;
  o[6] = blockDim.x * 10000 + blockDim.y * 100 + blockDim.z;
  o[7] = gridDim.x * 10000 + gridDim.y * 100 + gridDim.z;
}

TEST(CudaEmuTest, EveryThreadOfA3dGridSeesItsOwnIndices) {
  const dim3 grid(3, 2, 4);
  const dim3 block(8, 4, 2);
  const size_t threads = size_t{3 * 2 * 4} * (8 * 4 * 2);
  DeviceBuffer<uint32_t> out(8 * threads);
  ASSERT_EQ(EmuLaunch(Id(&IndexKernel), grid, block, 0, nullptr, [p = out.get()] { IndexKernel(p); }), cudaSuccess);
  const std::vector<uint32_t> host = out.Read();
  for (uint32_t bz = 0; bz < 4; ++bz) {
    for (uint32_t by = 0; by < 2; ++by) {
      for (uint32_t bx = 0; bx < 3; ++bx) {
        for (uint32_t tz = 0; tz < 2; ++tz) {
          for (uint32_t ty = 0; ty < 4; ++ty) {
            for (uint32_t tx = 0; tx < 8; ++tx) {
              const size_t b = bx + 3 * (by + 2 * bz);
              const size_t t = tx + 8 * (ty + 4 * tz);
              const uint32_t* o = &host[8 * (b * 64 + t)];
              ASSERT_EQ(o[0], tx);
              ASSERT_EQ(o[1], ty);
              ASSERT_EQ(o[2], tz);
              ASSERT_EQ(o[3], bx);
              ASSERT_EQ(o[4], by);
              ASSERT_EQ(o[5], bz);
              ASSERT_EQ(o[6], 80402u);
              ASSERT_EQ(o[7], 30204u);
            }
          }
        }
      }
    }
  }
}

// ---- Shared-memory reduction ----

TEST(CudaEmuTest, SharedMemoryTreeReductionGivesExactSums) {
  const int blocks = 37;
  std::vector<int64_t> in(blocks * 256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>((i * 7919) % 1000) - 300;
  DeviceBuffer<int64_t> d_in(in.size());
  d_in.Write(in);
  DeviceBuffer<int64_t> d_out(blocks);
  ASSERT_EQ(EmuLaunch(Id(&BlockReduceKernel), dim3(blocks), dim3(256), 0, nullptr,
                      [i = d_in.get(), o = d_out.get()] { BlockReduceKernel(i, o); }),
            cudaSuccess);
  const std::vector<int64_t> out = d_out.Read();
  for (int b = 0; b < blocks; ++b) {
    int64_t expected = 0;
    for (int t = 0; t < 256; ++t) expected += in[b * 256 + t];
    EXPECT_EQ(out[b], expected) << "block " << b;
  }
}

// ---- Shuffles ----

TEST(CudaEmuTest, ShufflesReturnExactlyTheSourceLanesValues) {
  DeviceBuffer<ShuffleOut> d_out(1);
  ASSERT_EQ(EmuLaunch(Id(&ShuffleKernel), dim3(1), dim3(64), 0, nullptr, [o = d_out.get()] { ShuffleKernel(o); }),
            cudaSuccess);
  const ShuffleOut out = d_out.Read()[0];
  for (int t = 0; t < 64; ++t) {
    const int warp = t / 32 * 32;
    const int lane = t % 32;
    EXPECT_EQ(out.xor5[t], (warp + (lane ^ 5)) * 10) << t;
    EXPECT_EQ(out.down3[t], (lane + 3 < 32 ? t + 3 : t) * 10 + 1) << t;
    EXPECT_EQ(out.up2[t], (lane >= 2 ? t - 2 : t) * 10 + 2) << t;
    EXPECT_EQ(out.idx[t], (warp + (lane * 7) % 32) * 10 + 3) << t;
    EXPECT_EQ(out.xor1_width8[t], (t ^ 1) * 10 + 4) << t;
    EXPECT_EQ(out.down1_width8[t], (lane % 8 == 7 ? t : t + 1) * 10 + 5) << t;
    EXPECT_EQ(out.up3_width16[t], (lane % 16 >= 3 ? t - 3 : t) * 10 + 6) << t;
    EXPECT_EQ(out.idx_width8[t], (t / 8 * 8 + 2) * 10 + 7) << t;
    EXPECT_EQ(out.wide[t], (int64_t{warp + (lane ^ 16)} << 40) + 9) << t;
    EXPECT_EQ(out.sum[t], 496.0f) << t;
  }
}

// ---- Early exit ----

// Threads >= 100 return at once; the rest still meet at __syncthreads, in a loop.
void EarlyExitKernel(int* out) {
  __shared__ int values[128];
  const int t = static_cast<int>(threadIdx.x);
  if (t >= 100) return;
  values[t] = t;
  for (int round = 0; round < 3; ++round) {
    __syncthreads();
    if (t == 0) {
      int sum = 0;
      for (int i = 0; i < 100; ++i) sum += values[i];
      out[round] = sum;
    }
    __syncthreads();
    values[t] += 1;
  }
}

TEST(CudaEmuTest, BarrierWaitsOnlyForThreadsThatHaveNotExited) {
  DeviceBuffer<int> d_out(3);
  ASSERT_EQ(EmuLaunch(Id(&EarlyExitKernel), dim3(2), dim3(128), 0, nullptr, [o = d_out.get()] { EarlyExitKernel(o); }),
            cudaSuccess);
  EXPECT_EQ(d_out.Read(), (std::vector<int>{4950, 5050, 5150}));
}

// ---- Stack ----

// A few KiB of locals per thread across a barrier.
void LocalArrayKernel(int* out) {
  int local[2048];
  for (int i = 0; i < 2048; ++i) local[i] = i * static_cast<int>(threadIdx.x + 1);
  __syncthreads();
  int sum = 0;
  for (int i = 0; i < 2048; ++i) sum += local[i];
  out[threadIdx.x] = sum;
}

TEST(CudaEmuTest, ThreadLocalsSurviveBarriersOnTheirOwnStacks) {
  DeviceBuffer<int> d_out(1024);
  ASSERT_EQ(
      EmuLaunch(Id(&LocalArrayKernel), dim3(2), dim3(1024), 0, nullptr, [o = d_out.get()] { LocalArrayKernel(o); }),
      cudaSuccess);
  const std::vector<int> out = d_out.Read();
  for (int t = 0; t < 1024; ++t) EXPECT_EQ(out[t], 2047 * 2048 / 2 * (t + 1)) << t;
}

// ---- Shared memory ----

// out[block * 64 + t] = 1 if the thread saw all-ones (NaN) bits in its slot
// of the block's shared `words`; then the thread writes its slot.
void CheckStartsAsNan(float* words, int* out) {
  const unsigned int t = threadIdx.x;
  uint32_t bits;
  std::memcpy(&bits, &words[t], sizeof(bits));
  out[blockIdx.x * 64 + t] = (std::isnan(words[t]) && bits == 0xffffffffu) ? 1 : 0;
  __syncthreads();
  words[t] = 1.0f;  // must not leak into the next block
}

void DynamicSmemKernel(int* out) { CheckStartsAsNan(static_cast<float*>(DynamicSharedMemory()), out); }

TEST(CudaEmuTest, DynamicSharedMemoryStartsAsNanInEveryBlock) {
  DeviceBuffer<int> d_out(3 * 64);
  ASSERT_EQ(EmuLaunch(Id(&DynamicSmemKernel), dim3(3), dim3(64), 64 * sizeof(float), nullptr,
                      [o = d_out.get()] { DynamicSmemKernel(o); }),
            cudaSuccess);
  EXPECT_EQ(d_out.Read(), std::vector<int>(3 * 64, 1));
}

// A buggy block sum: thread 0 adds into a __shared__ total it never zeroes,
// the bug a zero-initialized emulation hid (the right sum, 64, every time).
void UnzeroedStaticSmemSumKernel(float* out) {
  __shared__ float total;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 64; ++i) total += 1.0f;
    out[blockIdx.x] = total;
  }
}

void StaticSmemKernel(int* out) {
  __shared__ float words[64];
  CheckStartsAsNan(words, out);
}

TEST(CudaEmuTest, StaticSharedMemoryStartsAsNanInEveryBlock) {
  DeviceBuffer<int> d_out(3 * 64);
  ASSERT_EQ(EmuLaunch(Id(&StaticSmemKernel), dim3(3), dim3(64), 0, nullptr, [o = d_out.get()] { StaticSmemKernel(o); }),
            cudaSuccess);
  EXPECT_EQ(d_out.Read(), std::vector<int>(3 * 64, 1));
}

TEST(CudaEmuTest, ReadOfUnzeroedStaticSharedMemoryGivesNan) {
  DeviceBuffer<float> d_out(2);
  ASSERT_EQ(EmuLaunch(Id(&UnzeroedStaticSmemSumKernel), dim3(2), dim3(32), 0, nullptr,
                      [o = d_out.get()] { UnzeroedStaticSmemSumKernel(o); }),
            cudaSuccess);
  for (float sum : d_out.Read()) EXPECT_TRUE(std::isnan(sum)) << sum;
}

// ---- Interprocess memory ----

// A toy importer's peer copy, as CudaPeerMemory::CopyToPeer does it: the
// destination must lie in a mapping it opened. Called with the exporter's own
// pointer (the local/peer mix-up), it copied before, when the opened pointer
// was the exporter's; now that the opening is a distinct mapping it refuses.
bool ToyCopyToPeer(const std::vector<std::pair<float*, size_t>>& opened, float* peer_dst, const float* src,
                   size_t count) {
  for (const auto& [base, size] : opened) {
    if (peer_dst >= base && peer_dst + count <= base + size) {
      return cudaMemcpy(peer_dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice) == cudaSuccess;
    }
  }
  return false;
}

TEST(CudaEmuTest, AnOpenedIpcHandleIsADistinctMappingOfTheSameMemory) {
  DeviceBuffer<float> exported(64);
  DeviceBuffer<float> source(64);
  source.Write(std::vector<float>(64, 3.0f));
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, exported.get()), cudaSuccess);
  float* opened = nullptr;
  ASSERT_EQ(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&opened), handle, cudaIpcMemLazyEnablePeerAccess),
            cudaSuccess);
  EXPECT_NE(opened, exported.get());

  // The mix-up is refused; the right pointer's bytes reach the exporter.
  const std::vector<std::pair<float*, size_t>> peers = {{opened, 64}};
  EXPECT_FALSE(ToyCopyToPeer(peers, exported.get() + 8, source.get(), 8));
  EXPECT_TRUE(std::isnan(exported.Read()[8])) << "untouched: still the NaN cudaMalloc fills with";
  ASSERT_TRUE(ToyCopyToPeer(peers, opened + 8, source.get(), 8));
  const std::vector<float> got = exported.Read();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(std::isnan(got[i]), i < 8 || i >= 16) << i;
  for (int i = 8; i < 16; ++i) EXPECT_EQ(got[i], 3.0f) << i;

  // The exporter's writes are seen through the mapping, by copies and memsets.
  exported.Write(std::vector<float>(64, 5.0f));
  std::vector<float> back(64);
  ASSERT_EQ(cudaMemcpy(back.data(), opened, sizeof(float) * 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, std::vector<float>(64, 5.0f));
  ASSERT_EQ(cudaMemset(opened, 0, sizeof(float) * 4), cudaSuccess);
  EXPECT_EQ(exported.Read()[3], 0.0f);
  EXPECT_EQ(exported.Read()[4], 5.0f);

  // Each pointer is released only by its own call.
  EXPECT_EQ(cudaIpcCloseMemHandle(exported.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(opened), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaIpcCloseMemHandle(opened), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(back.data(), opened, sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

// ---- Fast intrinsics ----

// Ulps between two positive finite floats.
int64_t UlpDistance(float a, float b) {
  return std::llabs(static_cast<int64_t>(__float_as_uint(a)) - static_cast<int64_t>(__float_as_uint(b)));
}

// A kernel check that assumed __expf within 1 ulp of e^x (the emulator's exact
// std::exp passed it) now sees the GPU's documented error, 2 + floor(|1.16 x|)
// ulp, and the same result for the same x.
TEST(CudaEmuTest, ExpfIsOffByTheGpusDocumentedBoundAndDeterministic) {
  int up = 0;
  int down = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    const float exact = std::exp(x);
    const float fast = __expf(x);
    const int64_t bound = 2 + static_cast<int64_t>(std::floor(std::fabs(1.16f * x)));
    EXPECT_EQ(UlpDistance(fast, exact), bound) << x;
    EXPECT_GT(UlpDistance(fast, exact), 1) << x;
    EXPECT_EQ(__float_as_uint(__expf(x)), __float_as_uint(fast)) << x;
    (fast > exact ? up : down)++;
  }
  EXPECT_GT(up, 0);
  EXPECT_GT(down, 0);
  EXPECT_EQ(__expf(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(__expf(200.0f)));
  EXPECT_TRUE(std::isnan(__expf(std::nanf(""))));
}

// ---- Launch configuration ----

void NoopKernel(int* counter) {
  if (threadIdx.x == 0) ++*counter;
}
void BigSmemKernel(int* counter) { NoopKernel(counter); }
void HugeSmemKernel(int* counter) { NoopKernel(counter); }

TEST(CudaEmuTest, BadLaunchConfigurationsFailRunNothingAndAreReportedOnce) {
  int counter = 0;
  auto body = [&counter] { NoopKernel(&counter); };
  const void* noop = Id(&NoopKernel);
  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(1025), 0, nullptr, body), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(33), 0, nullptr, body), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(32, 2, 0), 0, nullptr, body), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmuLaunch(noop, dim3(0), dim3(32), 0, nullptr, body), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmuLaunch(noop, dim3(1, 65536), dim3(32), 0, nullptr, body), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(32), 49 * 1024, nullptr, body), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(counter, 0);

  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(32), 48 * 1024, nullptr, body), cudaSuccess);
  EXPECT_EQ(EmuLaunch(noop, dim3(2), dim3(1024), 0, nullptr, body), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(counter, 0) << "a launch ran before anything ordered it";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter, 3);

  // Raised limit for one kernel only.
  ASSERT_EQ(cudaFuncSetAttribute(Id(&BigSmemKernel), cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024),
            cudaSuccess);
  EXPECT_EQ(
      EmuLaunch(Id(&BigSmemKernel), dim3(1), dim3(32), 227 * 1024, nullptr, [&counter] { BigSmemKernel(&counter); }),
      cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter, 4);
  EXPECT_EQ(EmuLaunch(Id(&BigSmemKernel), dim3(1), dim3(32), 227 * 1024 + 1, nullptr,
                      [&counter] { BigSmemKernel(&counter); }),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(EmuLaunch(noop, dim3(1), dim3(32), 49 * 1024, nullptr, body), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(Id(&HugeSmemKernel), cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(
      EmuLaunch(Id(&HugeSmemKernel), dim3(1), dim3(32), 228 * 1024, nullptr, [&counter] { HugeSmemKernel(&counter); }),
      cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter, 4);
}

// ---- Memory ----

TEST(CudaEmuTest, MallocFillsWithOnesAndCopiesStayInsideLiveAllocations) {
  uint8_t* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 64), cudaSuccess);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dev) % 256, 0u);
  std::vector<uint8_t> host(128, 7);
  ASSERT_EQ(cudaMemcpy(host.data(), dev, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::vector<uint8_t>(host.begin(), host.begin() + 64), std::vector<uint8_t>(64, 0xFF));

  EXPECT_EQ(cudaMemcpy(dev, host.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev + 32, host.data(), 32, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev + 32, host.data(), 33, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), dev + 1, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  // Wrong kind: the host buffer is taken as the device source.
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, dev + 32, 32, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev + 1, dev + 32, 32, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev + 33, dev, 32, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 65, cudaMemcpyDefault), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), dev + 60, 8, cudaMemcpyDefault), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 64, 64, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaMemset(dev, 0, 64), cudaSuccess);
  EXPECT_EQ(cudaMemset(dev + 1, 0, 64), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(dev + 64, 0, 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(dev, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);

  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_EQ(total, size_t{16} << 30);
  EXPECT_LE(free_before, total - 64);

  ASSERT_EQ(cudaFree(dev), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(dev, 0, 16), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(dev), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 100), cudaSuccess);
  std::memset(pinned, 1, 100);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(host.data()), cudaErrorInvalidValue);
  ASSERT_EQ(cudaHostAlloc(&pinned, 10, cudaHostAllocDefault), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  cudaGetLastError();
}

// ---- Device, events ----

TEST(CudaEmuTest, ReportsOneDeviceWithDefaultProperties) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  int device = -1;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
  cudaDeviceProp prop;
  prop.warpSize = 0;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 227u * 1024);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 1), cudaErrorInvalidDevice);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaGetLastError();
}

TEST(CudaEmuTest, EventsMeasureHostTimeBetweenRecords) {
  cudaEvent_t start, end;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorInvalidValue);  // not recorded yet
  cudaGetLastError();
  ASSERT_EQ(cudaEventRecord(start), cudaSuccess);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  while (std::chrono::steady_clock::now() < until) {
  }
  ASSERT_EQ(cudaEventRecord(end), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 2.0f);
  EXPECT_LT(ms, 10000.0f);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);
}

// ---- Capture and replay ----

void ScaleKernel(float* data, float factor, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] *= factor;
}

TEST(CudaEmuTest, CapturedGraphReplaysKernelsWithCapturedArgsAndReadsSourcesAtReplay) {
  const int n = 100;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), n * sizeof(float)), cudaSuccess);
  std::vector<float> input(n, 1.0f), output(n, -1.0f);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, input.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
  float factor = 3.0f;
  ASSERT_EQ(EmuLaunch(Id(&ScaleKernel), dim3(2), dim3(64), 0, stream, [dev, factor] { ScaleKernel(dev, factor, n); }),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev, 0, sizeof(float), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(output.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(output, std::vector<float>(n, -1.0f)) << "capture ran an operation";
  factor = 100.0f;  // the launch keeps the value captured

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < n; ++i) input[i] = static_cast<float>(i);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(output[0], 0.0f);
  for (int i = 1; i < n; ++i) ASSERT_EQ(output[i], 3.0f * i) << i;

  for (int i = 0; i < n; ++i) input[i] = static_cast<float>(2 * i);  // replay reads the new source
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(output[1], 3.0f) << "a replay ran before anything ordered it";
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 1; i < n; ++i) ASSERT_EQ(output[i], 6.0f * i) << i;

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaEmuTest, SynchronousOperationDuringCaptureInvalidatesIt) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), sizeof(float)), cudaSuccess);
  float host = 5.0f;
  cudaGraph_t graph = nullptr;

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dev, &host, sizeof(float), cudaMemcpyHostToDevice), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaMemset(dev, 0, sizeof(float)), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);

  // Not capturing any more: synchronous work runs again.
  EXPECT_EQ(cudaMemcpy(dev, &host, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---- Faults ----

// Lanes 0-15 of every warp wait at __syncthreads while lanes 16-31 wait at a
// shuffle for them: neither can go on.
void HalfBarrierKernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) __syncthreads();
  v = __shfl_xor_sync(kFull, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

// Lanes 16-31 skip the shuffle and exit.
void DivergentShuffleKernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(kFull, v, 1);
  out[threadIdx.x] = v;
}

void PartialMaskKernel(float* out) { out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1); }

void LaunchFault(void (*kernel)(float*)) {
  static float out[256];
  EmuLaunch(Id(kernel), dim3(2), dim3(256), 0, nullptr, [kernel] { kernel(out); });
  cudaDeviceSynchronize();  // the kernel runs (and faults) here
}

TEST(CudaEmuDeathTest, SyncthreadsReachedByHalfTheBlockAborts) {
  EXPECT_DEATH(LaunchFault(&HalfBarrierKernel), "deadlock: .*block \\(0,0,0\\).*thread \\(16,0,0\\)");
}

TEST(CudaEmuDeathTest, ShuffleInDivergentBranchAborts) {
  EXPECT_DEATH(LaunchFault(&DivergentShuffleKernel),
               "divergent warp collective: block \\(0,0,0\\).*warp 0.*lane 16 \\(thread \\(16,0,0\\)\\) never reaches.*"
               "exited");
}

TEST(CudaEmuDeathTest, PartialMaskAborts) {
  EXPECT_DEATH(LaunchFault(&PartialMaskKernel), "divergent warp collective: .*mask 0x0000ffff");
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HS_TEST_ASAN 1
#endif
#endif
#if !defined(HS_TEST_ASAN) && defined(__SANITIZE_ADDRESS__)
#define HS_TEST_ASAN 1
#endif

// Thread 63 writes one element past a 64-float allocation.
[[maybe_unused]] void OutOfBoundsKernel(float* data) {
  __syncthreads();
  data[threadIdx.x + 1] = 1.0f;
}

TEST(CudaEmuDeathTest, OutOfBoundsDeviceWriteIsCaughtByAsanOnAFiberStack) {
#if defined(HS_TEST_ASAN)
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), 64 * sizeof(float)), cudaSuccess);
  EXPECT_DEATH(
      {
        EmuLaunch(Id(&OutOfBoundsKernel), dim3(1), dim3(64), 0, nullptr, [dev] { OutOfBoundsKernel(dev); });
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow.*\n.*WRITE of size 4");
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
#else
  GTEST_SKIP() << "needs --config=asan";
#endif
}

TEST(CudaEmuDeathTest, BarrierOutsideAKernelAborts) {
  EXPECT_DEATH(__syncthreads(), "__syncthreads\\(\\) called outside a kernel");
}

// ---- Host threads ----

TEST(CudaEmuTest, LaunchesFromSeveralHostThreadsAreSerializedAndCorrect) {
  const int blocks = 8;
  std::vector<int64_t> in(blocks * 256);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int64_t>(i);
  DeviceBuffer<int64_t> d_in(in.size());
  d_in.Write(in);
  constexpr int kThreads = 4;
  std::vector<std::vector<int64_t>> results(kThreads, std::vector<int64_t>(blocks, -1));
  std::vector<cudaError_t> errors(kThreads, cudaErrorNotReady);
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      int64_t* out = nullptr;
      if (cudaMalloc(reinterpret_cast<void**>(&out), blocks * sizeof(int64_t)) != cudaSuccess) return;
      for (int repeat = 0; repeat < 20; ++repeat) {
        errors[k] = EmuLaunch(Id(&BlockReduceKernel), dim3(blocks), dim3(256), 0, nullptr,
                              [i = d_in.get(), out] { BlockReduceKernel(i, out); });
        if (errors[k] != cudaSuccess) break;
      }
      cudaMemcpy(results[k].data(), out, blocks * sizeof(int64_t), cudaMemcpyDeviceToHost);
      cudaFree(out);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int k = 0; k < kThreads; ++k) {
    EXPECT_EQ(errors[k], cudaSuccess);
    for (int b = 0; b < blocks; ++b) {
      const int64_t first = int64_t{b} * 256;
      EXPECT_EQ(results[k][b], 256 * first + 255 * 256 / 2) << "thread " << k << " block " << b;
    }
  }
}

// ---- Throughput (printed, not asserted) ----

void BarrierLoopKernel(int iterations, int* out) {
  __shared__ int counter[256];
  counter[threadIdx.x] = 0;
  for (int i = 0; i < iterations; ++i) {
    counter[threadIdx.x] += 1;
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = counter[255];
}

TEST(CudaEmuTest, BarrierThroughputIsPrinted) {
  const int blocks = 64;
  const int iterations = 100;
  DeviceBuffer<int> d_out(blocks);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(EmuLaunch(Id(&BarrierLoopKernel), dim3(blocks), dim3(256), 0, nullptr,
                      [o = d_out.get()] { BarrierLoopKernel(iterations, o); }),
            cudaSuccess);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(d_out.Read(), std::vector<int>(blocks, iterations));
  std::printf("cuda_emu: %.0f block barriers/s with 256 threads (%.1f ns per thread switch)\n",
              blocks * iterations / seconds, seconds * 1e9 / (double{blocks} * iterations * 256));
}

}  // namespace
}  // namespace hybridserve::kernels::cuda_emu
