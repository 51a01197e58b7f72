// The CUDA row kernels (kernels/cuda/elementwise.cu: GatherRows, ScatterAddRows)
// against the CPU kernels, on the emulated build and (where a device is
// present) on the GPU. Both are bitwise on every target: GatherRows copies, and
// ScatterAddRows rounds each multiply and add explicitly (__fmul_rn/__fadd_rn)
// in the order the CPU (built with -ffp-contract=off) evaluates them.

#include "kernels/cpu/rows.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/test_backends.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels {
namespace {

using cpu::testing::BitsEqual;
using cpu::testing::RandomVector;
using cuda_testing::CudaTargetName;
using cuda_testing::CudaTestTargets;

constexpr float kSentinel = 7.25f;  // fills rows and padding a kernel must not write

class RowsTest : public cuda_testing::CudaKernelTest {};

// [rows, stride] filled with kSentinel, the first `dim` of each row random.
std::vector<float> RandomRows(std::mt19937& rng, int64_t rows, int64_t dim, int64_t stride) {
  std::vector<float> v(rows * stride, kSentinel);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) v[r * stride + i] = dist(rng);
  }
  return v;
}

// The layouts every case runs in. kContiguous: strides 0 (dim), 16-byte
// aligned; kStrided: strides not a multiple of 4 (scalar loads);
// kAlignedStrided: strides a multiple of 4 past dim (vector loads where dim % 4
// == 0); kUnaligned: x and out start one float into their buffers.
enum Layout { kContiguous, kStrided, kAlignedStrided, kUnaligned, kLayouts };

struct Strides {
  int64_t xs, os;  // the strides used (never 0)
  int64_t x_param, out_param;
  int64_t offset;  // elements from the buffer start to x and out
};

Strides LayoutStrides(Layout layout, int64_t dim) {
  switch (layout) {
    case kStrided:
      return {dim + 1, dim + 3, dim + 1, dim + 3, 0};
    case kAlignedStrided: {
      const int64_t s = (dim + 4 + 3) / 4 * 4;
      return {s, s + 4, s, s + 4, 0};
    }
    case kUnaligned:
      return {dim, dim, 0, 0, 1};
    default:
      return {dim, dim, 0, 0, 0};
  }
}

const int64_t kDims[] = {1, 3, 4, 7, 64, 257, 1030, 2052};

TEST_P(RowsTest, GatherRowsMatchesCpuBitwise) {
  std::mt19937 rng(31);
  int cases = 0;
  for (int64_t dim : kDims) {
    for (int l = 0; l < kLayouts; ++l) {
      const Strides s = LayoutStrides(static_cast<Layout>(l), dim);
      const int64_t x_rows = 23;
      const int64_t n = l == kContiguous ? 70 : 9;                          // 70: several blocks of packed narrow rows
      const std::vector<float> x = RandomRows(rng, x_rows + 1, dim, s.xs);  // + 1: room for the offset
      std::vector<int32_t> index(n);
      for (int32_t& v : index) v = std::uniform_int_distribution<int32_t>(0, x_rows - 1)(rng);
      index[0] = x_rows - 1;
      index[1] = index[0];  // a repeat
      const std::vector<float> out0((n + 1) * s.os, kSentinel);

      GatherRowsParams p;
      p.n_rows = n;
      p.dim = dim;
      p.x_row_stride = s.x_param;
      p.out_row_stride = s.out_param;
      std::vector<float> want = out0;
      p.x = x.data() + s.offset;
      p.index = index.data();
      p.out = want.data() + s.offset;
      ASSERT_EQ(cpu::GatherRows(p, nullptr), kKernelOk);

      DeviceBuffer dx = Up(x), didx = Up(index), dout = Up(out0);
      p.x = dx.as<float>() + s.offset;
      p.index = didx.as<int32_t>();
      p.out = dout.as<float>() + s.offset;
      ASSERT_EQ(b().GatherRows(p), kKernelOk);
      EXPECT_TRUE(BitsEqual(Down(dout), want)) << "dim " << dim << " layout " << l;
      EXPECT_FALSE(BitsEqual(want, out0)) << "dim " << dim << " layout " << l;  // the case wrote something
      ++cases;
    }
  }
  EXPECT_EQ(cases, static_cast<int>(std::size(kDims)) * kLayouts);
}

TEST_P(RowsTest, ScatterAddRowsMatchesCpuBitwise) {
  std::mt19937 rng(32);
  int cases = 0;
  for (int64_t dim : kDims) {
    for (int l = 0; l < kLayouts; ++l) {
      // form 0: index and weight (MoE combine); 1: index, no weight;
      // 2: no index, weight; 3: neither, alpha only (residual += m * y).
      for (int form = 0; form < 4; ++form) {
        const Strides s = LayoutStrides(static_cast<Layout>(l), dim);
        const bool with_index = form < 2, with_weight = form % 2 == 0;
        const int64_t n = l == kContiguous ? 70 : 9;
        const int64_t out_rows = with_index ? n + 11 : n;
        const std::vector<float> x = RandomRows(rng, n + 1, dim, s.xs);
        const std::vector<float> out0 = RandomRows(rng, out_rows + 1, dim, s.os);
        std::vector<int32_t> index(out_rows);
        std::iota(index.begin(), index.end(), 0);
        std::shuffle(index.begin(), index.end(), rng);
        index.resize(n);  // distinct
        const std::vector<float> weight = RandomVector(rng, n, 0.0f, 1.0f);

        ScatterAddRowsParams p;
        p.n_rows = n;
        p.dim = dim;
        p.alpha = form == 3 ? 0.22f : (form == 0 ? 1.0f : -1.7f);
        p.x_row_stride = s.x_param;
        p.out_row_stride = s.out_param;
        std::vector<float> want = out0;
        p.x = x.data() + s.offset;
        p.index = with_index ? index.data() : nullptr;
        p.weight = with_weight ? weight.data() : nullptr;
        p.out = want.data() + s.offset;
        ASSERT_EQ(cpu::ScatterAddRows(p, nullptr), kKernelOk);

        DeviceBuffer dx = Up(x), didx = Up(index), dw = Up(weight), dout = Up(out0);
        p.x = dx.as<float>() + s.offset;
        p.index = with_index ? didx.as<int32_t>() : nullptr;
        p.weight = with_weight ? dw.as<float>() : nullptr;
        p.out = dout.as<float>() + s.offset;
        ASSERT_EQ(b().ScatterAddRows(p), kKernelOk);
        EXPECT_TRUE(BitsEqual(Down(dout), want)) << "dim " << dim << " layout " << l << " form " << form;
        EXPECT_FALSE(BitsEqual(want, out0)) << "dim " << dim << " layout " << l << " form " << form;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, static_cast<int>(std::size(kDims)) * kLayouts * 4);
}

// A case where a fused multiply-add differs from the specified roundings (see
// kernels/cpu/rows_test.cc): x * w = 1 + 3 * 2^-23 + 2^-45 rounds before the add.
TEST_P(RowsTest, ScatterAddRowsRoundsEachOperation) {
  const std::vector<float> x = {1.0f + 0x1p-23f}, w = {1.0f + 0x1p-22f}, out0 = {-1.0f};
  DeviceBuffer dx = Up(x), dw = Up(w), dout = Up(out0);
  ScatterAddRowsParams p;
  p.x = dx.as<float>();
  p.weight = dw.as<float>();
  p.out = dout.as<float>();
  p.n_rows = 1;
  p.dim = 1;
  ASSERT_EQ(b().ScatterAddRows(p), kKernelOk);
  EXPECT_EQ(Down(dout)[0], 3 * 0x1p-23f);
}

TEST_P(RowsTest, ZeroRowsOrEmptyRowsWriteNothing) {
  const std::vector<float> out0(16, kSentinel);
  DeviceBuffer dout = Up(out0), didx = Up(std::vector<int32_t>{0, 1});
  GatherRowsParams g;  // n_rows 0: null pointers are fine
  g.dim = 4;
  EXPECT_EQ(b().GatherRows(g), kKernelOk);
  ScatterAddRowsParams s;
  s.dim = 4;
  EXPECT_EQ(b().ScatterAddRows(s), kKernelOk);
  g.x = dout.as<float>();
  g.index = didx.as<int32_t>();
  g.out = dout.as<float>() + 8;
  g.n_rows = 2;
  g.dim = 0;
  EXPECT_EQ(b().GatherRows(g), kKernelOk);
  EXPECT_TRUE(BitsEqual(Down(dout), out0));
}

TEST_P(RowsTest, RejectsInvalidArguments) {
  const std::vector<float> out0(64, kSentinel);
  DeviceBuffer buf = Up(out0), didx = Up(std::vector<int32_t>{1, 0});
  float* d = buf.as<float>();
  GatherRowsParams g;
  g.x = d;
  g.index = didx.as<int32_t>();
  g.out = d + 32;
  g.n_rows = 2;
  g.dim = 8;
  std::vector<GatherRowsParams> bad_g(7, g);
  bad_g[0].x = nullptr;
  bad_g[1].index = nullptr;
  bad_g[2].out = nullptr;
  bad_g[3].n_rows = -1;
  bad_g[4].dim = -1;
  bad_g[5].x_row_stride = 7;
  bad_g[6].out_row_stride = -8;
  for (size_t k = 0; k < bad_g.size(); ++k) EXPECT_EQ(b().GatherRows(bad_g[k]), kKernelInvalidArgument) << k;

  ScatterAddRowsParams s;
  s.x = d;
  s.out = d + 32;
  s.n_rows = 2;
  s.dim = 8;
  std::vector<ScatterAddRowsParams> bad_s(7, s);
  bad_s[0].x = nullptr;
  bad_s[1].out = nullptr;
  bad_s[2].n_rows = -3;
  bad_s[3].dim = -1;
  bad_s[4].out_row_stride = 4;
  bad_s[5].alpha = std::numeric_limits<float>::infinity();
  bad_s[6].alpha = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 0; k < bad_s.size(); ++k) EXPECT_EQ(b().ScatterAddRows(bad_s[k]), kKernelInvalidArgument) << k;
  EXPECT_EQ(b().Synchronize(), kKernelOk);
  EXPECT_TRUE(BitsEqual(Down(buf), out0));  // nothing launched
}

INSTANTIATE_TEST_SUITE_P(Cuda, RowsTest, CudaTestTargets(), CudaTargetName);

}  // namespace
}  // namespace hybridserve::kernels
