#include "kernels/cuda/vector_add.h"

#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cuda {
namespace {

TEST(CudaToolchainTest, NcclLinksAndReportsItsVersion) { EXPECT_GT(NcclVersion(), 20000); }

TEST(CudaToolchainTest, VectorAddMatchesTheCpu) {
  const int devices = DeviceCount();
  ASSERT_GE(devices, 0) << "CUDA error " << -devices << " while counting devices: a GPU machine with a broken setup";
  if (devices == 0) GTEST_SKIP() << "no CUDA device on this machine (no driver or no GPU): the kernel never ran";
  std::vector<float> a(10007), b(10007), out(10007, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = 1.0f / static_cast<float>(i + 1);
  }
  ASSERT_EQ(VectorAdd({a.data(), b.data(), out.data(), static_cast<int64_t>(a.size())}), 0);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;  // one IEEE add: exact
}

}  // namespace
}  // namespace hybridserve::kernels::cuda
