#ifndef HYBRIDSERVE_KERNELS_CUDA_TEST_BACKENDS_H_
#define HYBRIDSERVE_KERNELS_CUDA_TEST_BACKENDS_H_

// The CUDA backends a kernel test runs on: "emulated" (the .cu sources on the
// host emulator; always available) and "gpu" (the nvcc build; only where a
// device is present). Tests are parameterized over CudaTestTargets():
//
//   class NormTest : public ::testing::TestWithParam<CudaTarget> {};
//   TEST_P(NormTest, MatchesCpu) {
//     std::unique_ptr<Backend> gpu = MakeCudaTestBackendOrSkip(GetParam());
//     if (gpu == nullptr) return;  // skipped, with the reason in the output
//     ...
//   }
//   INSTANTIATE_TEST_SUITE_P(Cuda, NormTest, CudaTestTargets(), CudaTargetName);

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace hybridserve::kernels::cuda_testing {

enum class CudaTarget { kEmulated, kGpu };

inline auto CudaTestTargets() { return ::testing::Values(CudaTarget::kEmulated, CudaTarget::kGpu); }
std::string CudaTargetName(const ::testing::TestParamInfo<CudaTarget>& info);

// The backend for `target`; for kGpu without a device, skips the test
// with the reason ("... this test never ran on a GPU") and returns null. A GPU
// machine whose CUDA setup is broken fails instead, and so does a machine
// without a GPU where HS_REQUIRE_GPUS is set (kernels/cuda/gpu_requirement.h).
std::unique_ptr<Backend> MakeCudaTestBackendOrSkip(CudaTarget target);

// Device memory helpers over a Backend (ASSERT on failure inside).
DeviceBuffer Upload(Backend& backend, const void* host, int64_t bytes);
template <typename T>
DeviceBuffer Upload(Backend& backend, const std::vector<T>& host) {
  return Upload(backend, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
}
// A zero-filled buffer of `bytes`.
DeviceBuffer Zeros(Backend& backend, int64_t bytes);
// Copies `count` elements from device memory to a new vector (synchronizes).
template <typename T>
std::vector<T> Download(Backend& backend, const void* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  const int status = backend.CopyToHost(host.data(), device, count * static_cast<int64_t>(sizeof(T)));
  EXPECT_EQ(status, 0) << "CopyToHost failed";
  return host;
}

// A fixture over CudaTestTargets(): backend_ for the target (the test skips
// when it has none), with upload and download shorthands.
class CudaKernelTest : public ::testing::TestWithParam<CudaTarget> {
 protected:
  void SetUp() override {
    backend_ = MakeCudaTestBackendOrSkip(GetParam());
    if (backend_ == nullptr) GTEST_SKIP() << "no backend for this target";
  }
  bool emulated() const { return GetParam() == CudaTarget::kEmulated; }
  Backend& b() { return *backend_; }
  template <typename T>
  DeviceBuffer Up(const std::vector<T>& v) {
    return Upload(*backend_, v);
  }
  std::vector<float> Down(const DeviceBuffer& d) {
    return Download<float>(*backend_, d.data(), d.bytes() / static_cast<int64_t>(sizeof(float)));
  }

  std::unique_ptr<Backend> backend_;
};

// For its lifetime, the emulated GPU reports and enforces an opt-in limit of
// `bytes` of dynamic shared memory per block (another GPU's: 99 KiB is an
// sm_86's or sm_89's); the GPU target is unaffected. Not thread-safe: no
// launch may run while one is made or destroyed.
class ScopedEmulatedSmemOptin {
 public:
  explicit ScopedEmulatedSmemOptin(size_t bytes);
  ~ScopedEmulatedSmemOptin();
  ScopedEmulatedSmemOptin(const ScopedEmulatedSmemOptin&) = delete;
  ScopedEmulatedSmemOptin& operator=(const ScopedEmulatedSmemOptin&) = delete;
};

// Largest |a - b| / (atol + rtol * |b|) over the arrays (<= 1 passes), with
// the index where it occurs; NaN or infinity anywhere fails.
struct Closeness {
  double worst_ratio = 0.0;
  int64_t worst_index = -1;
  bool finite = true;
};
Closeness Compare(const float* actual, const float* expected, int64_t n, double atol, double rtol);
::testing::AssertionResult AllClose(const std::vector<float>& actual, const std::vector<float>& expected, double atol,
                                    double rtol);

}  // namespace hybridserve::kernels::cuda_testing

#endif  // HYBRIDSERVE_KERNELS_CUDA_TEST_BACKENDS_H_
