#include "kernels/cuda/device_presence.h"

#include "gtest/gtest.h"

namespace hybridserve::kernels::cuda {
namespace {

constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInsufficientDriver = 35;

TEST(UsableDeviceCountTest, OnlyNoDeviceAndNoDriverMeanNoGpu) {
  EXPECT_EQ(UsableDeviceCount(kCudaSuccess, 3, /*driver_loads=*/true), 3);
  EXPECT_EQ(UsableDeviceCount(kCudaSuccess, 0, /*driver_loads=*/true), 0);
  EXPECT_EQ(UsableDeviceCount(kCudaErrorNoDevice, 0, /*driver_loads=*/true), 0);
  // No driver library at all: whatever the runtime answered.
  EXPECT_EQ(UsableDeviceCount(kCudaErrorInsufficientDriver, 0, /*driver_loads=*/false), 0);
  EXPECT_EQ(UsableDeviceCount(kCudaErrorMemoryAllocation, 0, /*driver_loads=*/false), 0);
}

TEST(UsableDeviceCountTest, ATooOldDriverAndEveryOtherErrorAreBrokenSetupsNotMissingGpus) {
  EXPECT_EQ(UsableDeviceCount(kCudaErrorInsufficientDriver, 0, /*driver_loads=*/true), -kCudaErrorInsufficientDriver);
  EXPECT_EQ(UsableDeviceCount(kCudaErrorMemoryAllocation, 0, /*driver_loads=*/true), -kCudaErrorMemoryAllocation);
  EXPECT_EQ(UsableDeviceCount(999, 0, /*driver_loads=*/true), -999);  // cudaErrorUnknown
}

TEST(CudaDriverLoadsTest, TellsALoadableLibraryFromAMissingOne) {
  EXPECT_TRUE(CudaDriverLoads("libc.so.6"));
  EXPECT_FALSE(CudaDriverLoads("libhybridserve-no-such-cuda-driver.so.1"));
}

}  // namespace
}  // namespace hybridserve::kernels::cuda
