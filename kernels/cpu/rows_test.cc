#include "kernels/cpu/rows.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

using testing::BitsEqual;

constexpr float kSentinel = 7.25f;  // fills rows and padding a kernel must not write

// [rows, stride] filled with kSentinel, the first `dim` of each row random.
std::vector<float> RandomRows(std::mt19937& rng, int64_t rows, int64_t dim, int64_t stride) {
  std::vector<float> v(rows * stride, kSentinel);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) v[r * stride + j] = dist(rng);
  }
  return v;
}

// n distinct row indices drawn from [0, rows), in random order.
std::vector<int32_t> DistinctIndex(std::mt19937& rng, int64_t n, int64_t rows) {
  std::vector<int32_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

// One fp32 operation, correctly rounded, computed in double and rounded once:
// a double holds the exact product of two floats, and a double sum of two
// floats rounded to float is the correctly rounded float sum (53 >= 2 * 24 + 2
// bits). Independent of how the kernel's compiler contracts.
float MulRn(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }
float AddRn(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }

// ---------------------------------------------------------------- GatherRows

TEST(GatherRowsTest, CopiesIndexedRowsExactlyWithRepeatsAndStrides) {
  std::mt19937 rng(1);
  ThreadPool pool(3);
  // 700 x 64: several row tasks on the pool.
  for (auto [n, dim] : {std::pair<int64_t, int64_t>{5, 3}, {700, 64}, {9, 1}}) {
    const int64_t x_rows = 40, xs = dim + 3, os = dim + 1;
    const std::vector<float> x = RandomRows(rng, x_rows, dim, xs);
    std::vector<int32_t> index(n);
    for (int32_t& v : index) v = std::uniform_int_distribution<int32_t>(0, x_rows - 1)(rng);
    index[0] = static_cast<int32_t>(x_rows - 1);  // the last row
    if (n > 1) index[1] = index[0];               // a repeat
    for (ThreadPool* p_pool : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> out(n * os, kSentinel);
      GatherRowsParams p;
      p.x = x.data();
      p.index = index.data();
      p.out = out.data();
      p.n_rows = n;
      p.dim = dim;
      p.x_row_stride = xs;
      p.out_row_stride = os;
      ASSERT_EQ(GatherRows(p, p_pool), kKernelOk);
      std::vector<float> want(n * os, kSentinel);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < dim; ++j) want[i * os + j] = x[index[i] * xs + j];
      }
      EXPECT_TRUE(BitsEqual(out, want)) << "n " << n << " dim " << dim;
    }
  }
}

TEST(GatherRowsTest, ZeroRowsAcceptNullPointersAndWriteNothing) {
  GatherRowsParams p;
  p.dim = 8;
  EXPECT_EQ(GatherRows(p, nullptr), kKernelOk);
  float x[8] = {}, out[8] = {kSentinel};
  const int32_t index[1] = {0};
  p.x = x;
  p.index = index;
  p.out = out;
  p.dim = 0;
  p.n_rows = 1;
  EXPECT_EQ(GatherRows(p, nullptr), kKernelOk);
  EXPECT_EQ(out[0], kSentinel);
}

TEST(GatherRowsTest, RejectsInvalidArgumentsWritingNothing) {
  const std::vector<float> x(32, 1.0f);
  std::vector<float> out(32, kSentinel);
  const int32_t index[2] = {1, 0};
  GatherRowsParams ok;
  ok.x = x.data();
  ok.index = index;
  ok.out = out.data();
  ok.n_rows = 2;
  ok.dim = 4;
  std::vector<GatherRowsParams> bad(9, ok);
  bad[0].x = nullptr;
  bad[1].index = nullptr;
  bad[2].out = nullptr;
  bad[3].n_rows = -1;
  bad[4].dim = -1;
  bad[5].x_row_stride = 3;  // below dim
  bad[6].out_row_stride = 3;
  bad[7].x_row_stride = -4;
  bad[8].out_row_stride = -1;
  for (size_t k = 0; k < bad.size(); ++k) {
    EXPECT_EQ(GatherRows(bad[k], nullptr), kKernelInvalidArgument) << "case " << k;
    EXPECT_TRUE(BitsEqual(out, std::vector<float>(32, kSentinel))) << "case " << k;
  }
  ok.x_row_stride = 4;  // == dim: valid
  ok.out_row_stride = 16;
  EXPECT_EQ(GatherRows(ok, nullptr), kKernelOk);
}

// ---------------------------------------------------------------- ScatterAddRows

// The reference: rows in order, each step rounded to fp32 explicitly.
std::vector<float> ScatterAddReference(const ScatterAddRowsParams& p, std::vector<float> out) {
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  for (int64_t i = 0; i < p.n_rows; ++i) {
    const int64_t r = p.index != nullptr ? p.index[i] : i;
    const float w = p.weight != nullptr ? p.weight[i] : 1.0f;
    for (int64_t j = 0; j < p.dim; ++j) {
      float& o = out[r * os + j];
      o = AddRn(o, MulRn(MulRn(p.x[i * xs + j], w), p.alpha));
    }
  }
  return out;
}

TEST(ScatterAddRowsTest, MatchesRoundedReferenceForEveryIndexAndWeightForm) {
  std::mt19937 rng(2);
  ThreadPool pool(3);
  int checked = 0;
  // 600 x 96: several row tasks on the pool; 5 x 7: dims not a multiple of 4.
  for (auto [n, dim] : {std::pair<int64_t, int64_t>{5, 7}, {600, 96}, {3, 1}}) {
    for (int form = 0; form < 4; ++form) {
      // form 0: index and weight (MoE combine); 1: index, no weight;
      // 2: no index, weight; 3: neither, alpha only (residual += m * y).
      const bool with_index = form < 2, with_weight = form % 2 == 0;
      const int64_t out_rows = with_index ? n + 13 : n;
      const int64_t xs = dim + 2, os = dim + 5;
      const std::vector<float> x = RandomRows(rng, n, dim, xs);
      const std::vector<float> out0 = RandomRows(rng, out_rows, dim, os);
      const std::vector<int32_t> index = DistinctIndex(rng, n, out_rows);
      const std::vector<float> weight = testing::RandomVector(rng, n, 0.0f, 1.0f);
      ScatterAddRowsParams p;
      p.x = x.data();
      p.index = with_index ? index.data() : nullptr;
      p.weight = with_weight ? weight.data() : nullptr;
      p.alpha = form == 3 ? 0.22f : 1.0f;
      p.n_rows = n;
      p.dim = dim;
      p.x_row_stride = xs;
      p.out_row_stride = os;
      const std::vector<float> want = ScatterAddReference(p, out0);
      for (ThreadPool* p_pool : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> out = out0;
        p.out = out.data();
        ASSERT_EQ(ScatterAddRows(p, p_pool), kKernelOk);
        EXPECT_TRUE(BitsEqual(out, want)) << "n " << n << " dim " << dim << " form " << form;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 24);
}

// A case where one fused multiply-add (out + x * w, rounded once) and the
// specified roundings differ: x * w = 1 + 3 * 2^-23 + 2^-45 rounds to
// 1 + 3 * 2^-23, so out = -1 + that is 3 * 2^-23; fused it would keep the 2^-45.
TEST(ScatterAddRowsTest, RoundsEachOperationWithoutContraction) {
  const float x = 1.0f + 0x1p-23f;
  const float w = 1.0f + 0x1p-22f;
  float out = -1.0f;
  ScatterAddRowsParams p;
  p.x = &x;
  p.weight = &w;
  p.out = &out;
  p.n_rows = 1;
  p.dim = 1;
  ASSERT_EQ(ScatterAddRows(p, nullptr), kKernelOk);
  EXPECT_EQ(out, 3 * 0x1p-23f);
  EXPECT_NE(out, 3 * 0x1p-23f + 0x1p-45f);  // the fused result is a different float
}

TEST(ScatterAddRowsTest, NullWeightGivesTheBitsOfWeightOne) {
  std::mt19937 rng(3);
  const int64_t n = 17, dim = 33;
  const std::vector<float> x = RandomRows(rng, n, dim, dim);
  const std::vector<float> out0 = RandomRows(rng, n, dim, dim);
  const std::vector<float> ones(n, 1.0f);
  std::vector<float> a = out0, b = out0;
  ScatterAddRowsParams p;
  p.x = x.data();
  p.alpha = 0.37f;
  p.n_rows = n;
  p.dim = dim;
  p.out = a.data();
  ASSERT_EQ(ScatterAddRows(p, nullptr), kKernelOk);
  p.weight = ones.data();
  p.out = b.data();
  ASSERT_EQ(ScatterAddRows(p, nullptr), kKernelOk);
  EXPECT_TRUE(BitsEqual(a, b));
  EXPECT_FALSE(BitsEqual(a, out0));
}

TEST(ScatterAddRowsTest, RejectsInvalidArgumentsWritingNothing) {
  const std::vector<float> x(32, 1.0f);
  std::vector<float> out(32, kSentinel);
  ScatterAddRowsParams ok;
  ok.x = x.data();
  ok.out = out.data();
  ok.n_rows = 2;
  ok.dim = 4;
  std::vector<ScatterAddRowsParams> bad(10, ok);
  bad[0].x = nullptr;
  bad[1].out = nullptr;
  bad[2].n_rows = -1;
  bad[3].dim = -2;
  bad[4].x_row_stride = 2;
  bad[5].out_row_stride = 3;
  bad[6].x_row_stride = -1;
  bad[7].alpha = std::numeric_limits<float>::infinity();
  bad[8].alpha = -std::numeric_limits<float>::infinity();
  bad[9].alpha = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 0; k < bad.size(); ++k) {
    EXPECT_EQ(ScatterAddRows(bad[k], nullptr), kKernelInvalidArgument) << "case " << k;
    EXPECT_TRUE(BitsEqual(out, std::vector<float>(32, kSentinel))) << "case " << k;
  }
  ScatterAddRowsParams empty;  // n_rows 0: no pointer needed
  empty.dim = 4;
  EXPECT_EQ(ScatterAddRows(empty, nullptr), kKernelOk);
  EXPECT_EQ(ScatterAddRows(ok, nullptr), kKernelOk);
  EXPECT_EQ(out[0], kSentinel + 1.0f);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
