#include "kernels/cuda/test_backends.h"

#include <cmath>
#include <sstream>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/gpu_requirement.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cuda_testing {

std::string CudaTargetName(const ::testing::TestParamInfo<CudaTarget>& info) {
  return info.param == CudaTarget::kEmulated ? "Emulated" : "Gpu";
}

std::unique_ptr<Backend> MakeCudaTestBackendOrSkip(CudaTarget target) {
  std::string error;
  CudaBackendOptions options;
  options.workspace_bytes = int64_t{8} << 20;
  if (target == CudaTarget::kEmulated) {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
    // The emulator switches fiber stacks behind TSan's back; its runs are the
    // plain and ASan stages'.
    [] { GTEST_SKIP() << "the CUDA emulator does not run under ThreadSanitizer"; }();
    return nullptr;
#endif
#endif
    std::unique_ptr<Backend> backend = cuda_emu::CreateCudaBackend(options, &error);
    EXPECT_NE(backend, nullptr) << "the emulated CUDA backend failed to start: " << error;
    return backend;
  }
  // Skips without a GPU; fails on a broken CUDA setup, or without a GPU where HS_REQUIRE_GPUS is set.
  if (!HaveGpusOrSkip(1, cuda::CudaDeviceCount())) return nullptr;
  options.workspace_bytes = int64_t{64} << 20;
  std::unique_ptr<Backend> backend = cuda::CreateCudaBackend(options, &error);
  EXPECT_NE(backend, nullptr) << "the CUDA backend failed to start on a machine with a GPU: " << error;
  return backend;
}

ScopedEmulatedSmemOptin::ScopedEmulatedSmemOptin(size_t bytes) {
  cuda_emu::internal::SetMaxSharedMemoryPerBlockOptinForTesting(bytes);
}
ScopedEmulatedSmemOptin::~ScopedEmulatedSmemOptin() {
  cuda_emu::internal::SetMaxSharedMemoryPerBlockOptinForTesting(0);
}

DeviceBuffer Upload(Backend& backend, const void* host, int64_t bytes) {
  DeviceBuffer buffer;
  if (bytes <= 0) return buffer;
  EXPECT_EQ(backend.Allocate(bytes, &buffer), kKernelOk);
  if (buffer.empty()) return buffer;
  EXPECT_EQ(backend.CopyToDevice(buffer.data(), host, bytes), kKernelOk);
  return buffer;
}

DeviceBuffer Zeros(Backend& backend, int64_t bytes) {
  DeviceBuffer buffer;
  EXPECT_EQ(backend.Allocate(bytes, &buffer), kKernelOk);
  return buffer;
}

Closeness Compare(const float* actual, const float* expected, int64_t n, double atol, double rtol) {
  Closeness c;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(actual[i]) || !std::isfinite(expected[i])) {
      c.finite = false;
      c.worst_index = i;
      return c;
    }
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    const double ratio = err / (atol + rtol * std::fabs(static_cast<double>(expected[i])));
    if (ratio > c.worst_ratio || c.worst_index < 0) {
      c.worst_ratio = ratio;
      c.worst_index = i;
    }
  }
  return c;
}

::testing::AssertionResult AllClose(const std::vector<float>& actual, const std::vector<float>& expected, double atol,
                                    double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  const Closeness c = Compare(actual.data(), expected.data(), static_cast<int64_t>(actual.size()), atol, rtol);
  if (!c.finite) {
    return ::testing::AssertionFailure() << "non-finite value at element " << c.worst_index << ": "
                                         << actual[c.worst_index] << " vs " << expected[c.worst_index];
  }
  if (c.worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << c.worst_index << " of " << actual.size() << ": "
                                       << actual[c.worst_index] << " vs " << expected[c.worst_index] << " (error "
                                       << c.worst_ratio << "x the tolerance atol " << atol << " + rtol " << rtol << ")";
}

}  // namespace hybridserve::kernels::cuda_testing
