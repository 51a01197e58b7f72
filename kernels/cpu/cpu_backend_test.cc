#include "kernels/cpu/cpu_backend.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace hybridserve::kernels::cpu {
namespace {

TEST(CpuBackendTest, AllocateGivesZeroedAlignedMemoryOfEverySize) {
  CpuBackend backend(1);
  for (int64_t bytes : {int64_t{1}, int64_t{63}, int64_t{4096}, int64_t{3} << 20}) {
    DeviceBuffer b;
    ASSERT_EQ(backend.Allocate(bytes, &b), kKernelOk) << bytes;
    EXPECT_EQ(b.bytes(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << bytes;
    const auto* p = b.as<uint8_t>();
    for (int64_t i = 0; i < bytes; i += 997) EXPECT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
    EXPECT_EQ(p[bytes - 1], 0);
    EXPECT_EQ(b.backend(), &backend);
  }
}

TEST(CpuBackendTest, CopiesAndFillMoveExactlyTheBytesAsked) {
  CpuBackend backend(1);
  DeviceBuffer a, b;
  ASSERT_EQ(backend.Allocate(16, &a), kKernelOk);
  ASSERT_EQ(backend.Allocate(16, &b), kKernelOk);
  const std::vector<uint8_t> host = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(backend.CopyToDevice(a.as<uint8_t>() + 4, host.data(), 8), kKernelOk);
  ASSERT_EQ(backend.Fill(b.data(), 0xAB, 16), kKernelOk);
  ASSERT_EQ(backend.CopyOnDevice(b.as<uint8_t>() + 2, a.data(), 12), kKernelOk);
  std::vector<uint8_t> out(16, 0xFF);
  ASSERT_EQ(backend.CopyToHost(out.data(), b.data(), 16), kKernelOk);
  EXPECT_EQ(out, (std::vector<uint8_t>{0xAB, 0xAB, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0xAB, 0xAB}));
  EXPECT_EQ(backend.HostAddress(b.data()), b.data());
  EXPECT_EQ(backend.Synchronize(), kKernelOk);
}

TEST(CpuBackendTest, UploadConstantAliasesTheHostBytesAndReleasingLeavesThem) {
  CpuBackend backend(1);
  std::vector<float> weights = {1.5f, -2.0f};
  {
    DeviceBuffer w;
    ASSERT_EQ(backend.UploadConstant(weights.data(), 8, &w), kKernelOk);
    EXPECT_EQ(w.data(), weights.data());
  }
  EXPECT_EQ(weights[1], -2.0f);
}

TEST(CpuBackendTest, BadArgumentsAreRejectedAndChangeNothing) {
  CpuBackend backend(1);
  DeviceBuffer b;
  EXPECT_EQ(backend.Allocate(0, &b), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(-5, &b), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(8, nullptr), kKernelInvalidArgument);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(backend.UploadConstant(nullptr, 8, &b), kKernelInvalidArgument);
  ASSERT_EQ(backend.Allocate(32, &b), kKernelOk);
  EXPECT_EQ(backend.CopyOnDevice(b.as<uint8_t>() + 4, b.data(), 8), kKernelInvalidArgument);  // overlap
  EXPECT_EQ(backend.CopyToHost(nullptr, b.data(), 4), kKernelInvalidArgument);
  EXPECT_EQ(backend.Fill(b.data(), 1, -1), kKernelInvalidArgument);
  EXPECT_EQ(backend.Allocate(int64_t{1} << 62, &b), kKernelOutOfMemory);
  EXPECT_EQ(b.bytes(), 32);  // the failed allocation left the old buffer alone
}

TEST(CpuBackendTest, MovedBufferReleasesOnce) {
  CpuBackend backend(1);
  DeviceBuffer a;
  ASSERT_EQ(backend.Allocate(int64_t{2} << 20, &a), kKernelOk);
  void* data = a.data();
  DeviceBuffer b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  EXPECT_EQ(b.data(), data);
  b.Reset();
  EXPECT_TRUE(b.empty());
}

TEST(CpuBackendTest, EmbeddingGathersRowsAndRejectsOutOfRangeTokens) {
  CpuBackend backend(2);
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};  // [3, 2]
  DeviceBuffer t, tokens, out;
  ASSERT_EQ(backend.UploadConstant(table.data(), 24, &t), kKernelOk);
  ASSERT_EQ(backend.Allocate(16, &tokens), kKernelOk);
  ASSERT_EQ(backend.Allocate(32, &out), kKernelOk);
  const std::vector<int32_t> ids = {2, 0, 2, 1};
  ASSERT_EQ(backend.CopyToDevice(tokens.data(), ids.data(), 16), kKernelOk);
  EmbeddingParams p;
  p.table = t.as<float>();
  p.tokens = tokens.as<int32_t>();
  p.out = out.as<float>();
  p.n_tokens = 4;
  p.vocab = 3;
  p.dim = 2;
  ASSERT_EQ(backend.Embedding(p), kKernelOk);
  std::vector<float> got(8);
  ASSERT_EQ(backend.CopyToHost(got.data(), out.data(), 32), kKernelOk);
  EXPECT_EQ(got, (std::vector<float>{20, 21, 0, 1, 20, 21, 10, 11}));
  p.vocab = 2;  // token 2 is now out of range
  EXPECT_EQ(backend.Embedding(p), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
