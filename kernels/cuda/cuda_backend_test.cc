// The CUDA backend's memory calls and error reporting, on the emulated build
// and (where a device is present) on the GPU.

#include "kernels/cuda/cuda_backend.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_presence.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels {
namespace {

using cuda_testing::CudaTarget;
using cuda_testing::Download;
using cuda_testing::MakeCudaTestBackendOrSkip;
using cuda_testing::Upload;

class CudaBackendTest : public ::testing::TestWithParam<CudaTarget> {};

TEST_P(CudaBackendTest, AllocateIsZeroFilledAndCopiesRoundTrip) {
  std::unique_ptr<Backend> b = MakeCudaTestBackendOrSkip(GetParam());
  if (b == nullptr) return;
  EXPECT_STREQ(b->name(), "cuda");
  EXPECT_NE(std::string(b->variant()).find("sm_"), std::string::npos) << b->variant();
  DeviceBuffer buf;
  ASSERT_EQ(b->Allocate(1000, &buf), kKernelOk);
  EXPECT_EQ(buf.bytes(), 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u);
  EXPECT_EQ(b->HostAddress(buf.data()), nullptr);  // the host copies
  std::vector<uint8_t> zeros = Download<uint8_t>(*b, buf.data(), 1000);
  for (uint8_t v : zeros) ASSERT_EQ(v, 0);

  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(b->CopyToDevice(buf.data(), bytes.data(), 1000), kKernelOk);
  bytes.assign(bytes.size(), 0);  // the source may be reused as soon as the call returns
  std::vector<uint8_t> back = Download<uint8_t>(*b, buf.data(), 1000);
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], static_cast<uint8_t>(i * 7 + 3)) << i;

  DeviceBuffer other;
  ASSERT_EQ(b->Allocate(600, &other), kKernelOk);
  ASSERT_EQ(b->CopyOnDevice(other.data(), buf.as<uint8_t>() + 100, 500), kKernelOk);
  ASSERT_EQ(b->Fill(other.as<uint8_t>() + 500, 0xAB, 100), kKernelOk);
  std::vector<uint8_t> moved = Download<uint8_t>(*b, other.data(), 600);
  for (size_t i = 0; i < 500; ++i) ASSERT_EQ(moved[i], static_cast<uint8_t>((i + 100) * 7 + 3)) << i;
  for (size_t i = 500; i < 600; ++i) ASSERT_EQ(moved[i], 0xAB) << i;
  EXPECT_EQ(b->Synchronize(), kKernelOk);
}

TEST_P(CudaBackendTest, UploadConstantCopiesSoTheHostBytesMayGo) {
  std::unique_ptr<Backend> b = MakeCudaTestBackendOrSkip(GetParam());
  if (b == nullptr) return;
  DeviceBuffer buf;
  {
    std::vector<float> host = {1.5f, -2.25f, 3.0f};
    ASSERT_EQ(b->UploadConstant(host.data(), 12, &buf), kKernelOk);
    host.assign(3, 0.0f);
  }
  EXPECT_EQ(Download<float>(*b, buf.data(), 3), (std::vector<float>{1.5f, -2.25f, 3.0f}));
}

TEST_P(CudaBackendTest, RangesOutsideLiveBuffersAreInvalidArguments) {
  std::unique_ptr<Backend> b = MakeCudaTestBackendOrSkip(GetParam());
  if (b == nullptr) return;
  DeviceBuffer buf;
  ASSERT_EQ(b->Allocate(256, &buf), kKernelOk);
  std::vector<uint8_t> host(512, 1);
  uint8_t* d = buf.as<uint8_t>();
  EXPECT_EQ(b->CopyToDevice(d + 200, host.data(), 57), kKernelInvalidArgument);  // one byte past the end
  EXPECT_EQ(b->CopyToDevice(d + 200, host.data(), 56), kKernelOk);
  EXPECT_EQ(b->CopyToHost(host.data(), d, 257), kKernelInvalidArgument);
  EXPECT_EQ(b->CopyToDevice(host.data(), host.data() + 256, 8), kKernelInvalidArgument);  // host memory as device
  EXPECT_EQ(b->Fill(d + 1, 0, 256), kKernelInvalidArgument);
  EXPECT_EQ(b->CopyOnDevice(d + 8, d, 64), kKernelInvalidArgument);  // overlapping
  EXPECT_EQ(b->CopyToDevice(d, nullptr, 4), kKernelInvalidArgument);
  EXPECT_EQ(b->CopyToDevice(d, host.data(), -1), kKernelInvalidArgument);
  EXPECT_EQ(b->CopyToDevice(d, host.data(), 0), kKernelOk);
  DeviceBuffer none;
  EXPECT_EQ(b->Allocate(0, &none), kKernelInvalidArgument);
  EXPECT_EQ(b->Allocate(16, nullptr), kKernelInvalidArgument);
  // A released buffer's range is no longer device memory of this backend.
  void* stale = buf.data();
  buf.Reset();
  EXPECT_EQ(b->Fill(stale, 0, 16), kKernelInvalidArgument);
}

TEST_P(CudaBackendTest, AnOutOfRangeDeviceIndexIsReportedOnceAtTheNextSynchronize) {
  std::unique_ptr<Backend> b = MakeCudaTestBackendOrSkip(GetParam());
  if (b == nullptr) return;
  const int64_t vocab = 5, dim = 4;
  std::vector<float> table(vocab * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  DeviceBuffer t = Upload(*b, table);
  DeviceBuffer tokens = Upload(*b, std::vector<int32_t>{1, 7, 4});  // 7 >= vocab
  DeviceBuffer out = cuda_testing::Zeros(*b, 3 * dim * 4);
  EmbeddingParams p;
  p.table = t.as<float>();
  p.tokens = tokens.as<int32_t>();
  p.out = out.as<float>();
  p.n_tokens = 3;
  p.vocab = vocab;
  p.dim = dim;
  ASSERT_EQ(b->Embedding(p), kKernelOk);  // the launch cannot see device-resident tokens
  EXPECT_EQ(b->Synchronize(), kKernelInvalidArgument);
  EXPECT_EQ(b->Synchronize(), kKernelOk);  // reported once, then cleared
  std::vector<float> got = Download<float>(*b, out.data(), 3 * dim);
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_EQ(got[d], table[1 * dim + d]);
    EXPECT_EQ(got[dim + d], 0.0f) << "the bad row is skipped";
    EXPECT_EQ(got[2 * dim + d], table[4 * dim + d]);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaBackendTest, cuda_testing::CudaTestTargets(), cuda_testing::CudaTargetName);

TEST(CudaBackendCreateTest, BadOptionsSayWhy) {
  std::string error;
  CudaBackendOptions o;
  o.device_index = 3;
  EXPECT_EQ(cuda_emu::CreateCudaBackend(o, &error), nullptr);
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  o = CudaBackendOptions();
  o.workspace_bytes = 1000;
  EXPECT_EQ(cuda_emu::CreateCudaBackend(o, &error), nullptr);
  EXPECT_NE(error.find("workspace_bytes"), std::string::npos) << error;
  const int devices = cuda::CudaDeviceCount();
  ASSERT_GE(devices, 0) << "a GPU machine with a broken CUDA setup";
  if (devices == 0) {
    EXPECT_EQ(cuda::CreateCudaBackend(CudaBackendOptions(), &error), nullptr);
    EXPECT_FALSE(error.empty());
  }
}

// "No driver" is established by the driver library failing to load, never
// inferred from a CUDA error code (a too-old driver answers
// cudaErrorInsufficientDriver too): there the count is 0 and the backend says
// why. Where the driver loads, any error while counting is a failure.
TEST(CudaDeviceCountTest, WithoutTheDriverLibraryThereIsNoDeviceAndTheBackendSaysWhy) {
  const int devices = cuda::CudaDeviceCount();
  if (cuda::CudaDriverLoads()) {
    EXPECT_GE(devices, 0) << "CUDA error " << -devices << " on a machine with a CUDA driver: a broken CUDA setup";
    return;
  }
  EXPECT_EQ(devices, 0);
  std::string error;
  EXPECT_EQ(cuda::CreateCudaBackend(CudaBackendOptions(), &error), nullptr);
  EXPECT_NE(error.find("no CUDA driver: libcuda.so.1 does not load"), std::string::npos) << error;
}

}  // namespace
}  // namespace hybridserve::kernels
