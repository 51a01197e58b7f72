#include "kernels/cpu/rope.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

TEST(RopeTest, MatchesDoubleRotateHalfReference) {
  std::mt19937 rng(1);
  const int64_t tokens = 6, heads = 3, head_dim = 16, rot = 12;  // partial rotary
  const std::vector<float> x0 = testing::RandomVector(rng, tokens * heads * head_dim);
  std::vector<float> x = x0;
  RopeParams p;
  p.x = x.data();
  p.start_pos = 1000;
  p.n_tokens = tokens;
  p.n_heads = heads;
  p.head_dim = head_dim;
  p.rotary_dim = rot;
  p.theta = 10000.0;
  ASSERT_EQ(Rope(p, nullptr), kKernelOk);
  std::vector<double> want(x0.begin(), x0.end());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (t * heads + h) * head_dim;
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double angle = (1000.0 + t) * std::pow(10000.0, -2.0 * i / rot);
        const double a = x0[base + i], b = x0[base + i + rot / 2];
        want[base + i] = a * std::cos(angle) - b * std::sin(angle);
        want[base + i + rot / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  // fp32 cos/sin (rounded from double) and two fp32 products and a sum: a few
  // ulps of O(1) values; dims beyond rotary_dim are untouched exactly.
  EXPECT_TRUE(testing::AllClose(x, want, 1e-6, 1e-6));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = rot; i < head_dim; ++i) {
        const int64_t e = (t * heads + h) * head_dim + i;
        EXPECT_EQ(x[e], x0[e]);
      }
    }
  }
}

TEST(RopeTest, ExplicitPositionsGiveSameBitsAsStartPos) {
  std::mt19937 rng(2);
  const std::vector<float> x0 = testing::RandomVector(rng, 4 * 2 * 8);
  std::vector<float> a = x0, b = x0;
  RopeParams p;
  p.x = a.data();
  p.start_pos = 37;
  p.n_tokens = 4;
  p.n_heads = 2;
  p.head_dim = 8;
  ASSERT_EQ(Rope(p, nullptr), kKernelOk);
  const std::vector<int64_t> positions = {37, 38, 39, 40};
  p.x = b.data();
  p.start_pos = 0;
  p.positions = positions.data();
  ASSERT_EQ(Rope(p, nullptr), kKernelOk);
  EXPECT_TRUE(testing::BitsEqual(a, b));
  EXPECT_FALSE(testing::BitsEqual(a, x0));
}

TEST(RopeTest, RejectsOddRotaryDim) {
  std::vector<float> x(8);
  RopeParams p;
  p.x = x.data();
  p.n_tokens = 1;
  p.n_heads = 1;
  p.head_dim = 8;
  p.rotary_dim = 5;
  EXPECT_EQ(Rope(p, nullptr), kKernelInvalidArgument);
}

}  // namespace
}  // namespace hybridserve::kernels::cpu
