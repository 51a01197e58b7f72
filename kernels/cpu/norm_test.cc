#include "kernels/cpu/norm.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

double SiluRef(double x) { return x / (1.0 + std::exp(-x)); }

// Double reference of one group: out = v / sqrt(mean(v^2) + eps) * w.
void NormGroupRef(const double* v, const float* w, int64_t n, double eps, double* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = v[i] * inv * (w ? w[i] : 1.0);
}

// fp32 sum of squares over up to a few thousand elements in 8 lanes (relative
// error <= ~n/8 * 2^-24 ~ 3e-5 worst case, ~1e-6 typical), then rsqrt and two
// multiplies: 1e-5 relative plus 1e-6 absolute on O(1) outputs.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

TEST(RmsNormTest, MatchesDoubleReferenceAndRowsAreIndependent) {
  std::mt19937 rng(1);
  const int64_t rows = 9, dim = 1003;
  const std::vector<float> x = testing::RandomVector(rng, rows * dim, -3.0f, 3.0f);
  const std::vector<float> w = testing::RandomVector(rng, dim, 0.5f, 1.5f);
  ThreadPool pool(2);
  std::vector<float> out(x.size());
  RmsNormParams p;
  p.x = x.data();
  p.weight = w.data();
  p.out = out.data();
  p.n_rows = rows;
  p.dim = dim;
  p.eps = 1e-5f;
  ASSERT_EQ(RmsNorm(p, &pool), kKernelOk);
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> v(x.begin() + r * dim, x.begin() + (r + 1) * dim);
    NormGroupRef(v.data(), w.data(), dim, 1e-5, want.data() + r * dim);
  }
  EXPECT_TRUE(testing::AllClose(out, want, kRtol, kAtol));

  // Row 4 alone, in place: the same bits as inside the batch.
  std::vector<float> row(x.begin() + 4 * dim, x.begin() + 5 * dim);
  p.x = row.data();
  p.out = row.data();
  p.n_rows = 1;
  ASSERT_EQ(RmsNorm(p, nullptr), kKernelOk);
  EXPECT_TRUE(testing::BitsEqual(row.data(), out.data() + 4 * dim, dim));
}

TEST(GatedRmsNormTest, MatchesDoubleReferenceForBothGateOrders) {
  std::mt19937 rng(2);
  const int64_t rows = 5, dim = 96, group = 24;  // 4 groups
  const std::vector<float> x = testing::RandomVector(rng, rows * dim, -2.0f, 2.0f);
  const std::vector<float> z = testing::RandomVector(rng, rows * dim, -4.0f, 4.0f);
  const std::vector<float> w = testing::RandomVector(rng, dim, 0.5f, 1.5f);
  for (bool before : {false, true}) {
    std::vector<float> out(x.size());
    GatedRmsNormParams p;
    p.x = x.data();
    p.z = z.data();
    p.weight = w.data();
    p.out = out.data();
    p.n_rows = rows;
    p.dim = dim;
    p.group_size = group;
    p.eps = 1e-6f;
    p.norm_before_gate = before;
    ASSERT_EQ(GatedRmsNorm(p, nullptr), kKernelOk);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g0 = 0; g0 < dim; g0 += group) {
        std::vector<double> v(group);
        for (int64_t i = 0; i < group; ++i) {
          const int64_t e = r * dim + g0 + i;
          v[i] = before ? x[e] : x[e] * SiluRef(z[e]);
        }
        NormGroupRef(v.data(), w.data() + g0, group, 1e-6, want.data() + r * dim + g0);
        if (before) {
          for (int64_t i = 0; i < group; ++i) {
            want[r * dim + g0 + i] *= SiluRef(z[r * dim + g0 + i]);
          }
        }
      }
    }
    EXPECT_TRUE(testing::AllClose(out, want, kRtol, kAtol)) << "norm_before_gate " << before;
  }
}

TEST(GatedRmsNormTest, GroupsAreNormalizedSeparately) {
  // Two groups with very different scales each come out with unit RMS.
  std::vector<float> x = {1, 1, 1, 1, 100, -100, 100, -100};
  std::vector<float> out(8);
  GatedRmsNormParams p;
  p.x = x.data();
  p.out = out.data();
  p.n_rows = 1;
  p.dim = 8;
  p.group_size = 4;
  p.eps = 0.0f;
  ASSERT_EQ(GatedRmsNorm(p, nullptr), kKernelOk);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], 1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_FLOAT_EQ(std::fabs(out[i]), 1.0f);
}

TEST(GatedRmsNormTest, RejectsGroupNotDividingDim) {
  std::vector<float> x(10), out(10);
  GatedRmsNormParams p;
  p.x = x.data();
  p.out = out.data();
  p.n_rows = 1;
  p.dim = 10;
  p.group_size = 4;
  EXPECT_EQ(GatedRmsNorm(p, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
