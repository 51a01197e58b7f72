#include "kernels/cpu/activations.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

double SiluRef(double x) { return x / (1.0 + std::exp(-x)); }
double SoftplusRef(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// fp32 libm exp/log1p are within ~1 ulp; the fp32 divide and add add ~2 ulps:
// 1e-6 relative plus 1e-7 absolute for O(1)-O(10) inputs is ~10 ulps.
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-7;

TEST(ActivationTest, MatchesDoubleReferences) {
  std::mt19937 rng(1);
  const int64_t rows = 7, dim = 333;
  const std::vector<float> x = testing::RandomVector(rng, rows * dim, -30.0f, 30.0f);
  ThreadPool pool(2);
  for (ActivationKind kind : {ActivationKind::kSilu, ActivationKind::kReluSquared, ActivationKind::kSoftplus}) {
    std::vector<float> out(x.size());
    ActivationParams p;
    p.x = x.data();
    p.out = out.data();
    p.n_rows = rows;
    p.dim = dim;
    p.kind = kind;
    ASSERT_EQ(Activation(p, &pool), kKernelOk);
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      want[i] = kind == ActivationKind::kSilu       ? SiluRef(v)
                : kind == ActivationKind::kSoftplus ? SoftplusRef(v)
                                                    : (v > 0 ? v * v : 0.0);
    }
    EXPECT_TRUE(testing::AllClose(out, want, kRtol, kAtol)) << static_cast<int>(kind);
  }
}

TEST(ActivationTest, ReluSquaredIsExact) {
  EXPECT_EQ(ReluSquared(-3.0f), 0.0f);
  EXPECT_EQ(ReluSquared(3.0f), 9.0f);
  EXPECT_EQ(ReluSquared(0.5f), 0.25f);
}

// out = alpha * x is one fp32 multiply: exact against the same product.
TEST(ActivationTest, ScaleIsOneFp32MultiplyInPlaceAndStrided) {
  std::mt19937 rng(4);
  const int64_t rows = 6, dim = 37, xs = 41;
  const float alpha = 0.0078125f * 1.37f;  // not a power of two: the product rounds
  std::vector<float> x = testing::RandomVector(rng, rows * xs, -100.0f, 100.0f);
  ThreadPool pool(2);
  std::vector<float> out(rows * dim, -1.0f);
  ActivationParams p;
  p.x = x.data();
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.kind = ActivationKind::kScale;
  p.alpha = alpha;
  p.x_row_stride = xs;
  ASSERT_EQ(Activation(p, &pool), kKernelOk);
  std::vector<float> want(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = alpha * x[r * xs + i];
  }
  EXPECT_TRUE(testing::BitsEqual(out, want));

  // In place (out aliases x exactly, strides equal): the same bits.
  p.out = x.data();
  p.out_row_stride = xs;
  ASSERT_EQ(Activation(p, nullptr), kKernelOk);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(testing::BitsEqual(x.data() + r * xs, want.data() + r * dim, dim)) << "row " << r;
  }
}

TEST(ActivationTest, RejectsNonFiniteAlpha) {
  float x = 1.0f, out = 0.0f;
  ActivationParams p;
  p.x = &x;
  p.out = &out;
  p.n_rows = 1;
  p.dim = 1;
  p.kind = ActivationKind::kScale;
  for (float alpha : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
    p.alpha = alpha;
    EXPECT_EQ(Activation(p, nullptr), kKernelInvalidArgument) << alpha;
    EXPECT_EQ(out, 0.0f);
  }
  p.alpha = -3.0f;
  ASSERT_EQ(Activation(p, nullptr), kKernelOk);
  EXPECT_EQ(out, -3.0f);
}

TEST(SwiGluTest, FusedHalvesMatchDoubleReference) {
  std::mt19937 rng(2);
  const int64_t rows = 5, dim = 100;
  // One fused projection output per row: [gate (dim) | up (dim)].
  const std::vector<float> fused = testing::RandomVector(rng, rows * 2 * dim, -8.0f, 8.0f);
  std::vector<float> out(rows * dim);
  SwiGluParams p;
  p.gate = fused.data();
  p.up = fused.data() + dim;
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.gate_row_stride = 2 * dim;
  p.up_row_stride = 2 * dim;
  ASSERT_EQ(SwiGlu(p, nullptr), kKernelOk);
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      want[r * dim + i] = SiluRef(fused[r * 2 * dim + i]) * fused[r * 2 * dim + dim + i];
    }
  }
  EXPECT_TRUE(testing::AllClose(out, want, 2 * kRtol, kAtol));
}

TEST(DtSoftplusTest, AddsBiasAppliesSoftplusAndClamps) {
  std::mt19937 rng(3);
  const int64_t tokens = 9, heads = 6;
  const std::vector<float> raw = testing::RandomVector(rng, tokens * heads, -10.0f, 25.0f);
  const std::vector<float> bias = testing::RandomVector(rng, heads, -2.0f, 2.0f);
  for (float dt_max : {std::numeric_limits<float>::infinity(), 0.5f}) {
    std::vector<float> dt(tokens * heads);
    DtSoftplusParams p;
    p.dt_raw = raw.data();
    p.dt_bias = bias.data();
    p.dt = dt.data();
    p.n_tokens = tokens;
    p.n_heads = heads;
    p.dt_min = 1e-3f;
    p.dt_max = dt_max;
    ASSERT_EQ(DtSoftplus(p, nullptr), kKernelOk);
    std::vector<double> want(dt.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const double v = SoftplusRef(static_cast<double>(raw[t * heads + h] + bias[h]));
        want[t * heads + h] = std::min<double>(std::max(v, 1e-3), dt_max);
      }
    }
    EXPECT_TRUE(testing::AllClose(dt, want, kRtol, kAtol));
  }
}

TEST(ActivationTest, RejectsNullPointers) {
  ActivationParams p;
  p.n_rows = 1;
  p.dim = 1;
  EXPECT_EQ(Activation(p, nullptr), kKernelInvalidArgument);
  SwiGluParams s;
  EXPECT_EQ(SwiGlu(s, nullptr), kKernelInvalidArgument);
  DtSoftplusParams d;
  EXPECT_EQ(DtSoftplus(d, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
