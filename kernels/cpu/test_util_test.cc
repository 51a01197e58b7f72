// The kernel tests' comparisons fail on non-finite values: a NaN or an
// infinity in either input is never bit-equal and never within a tolerance
// (an infinite expected value would otherwise make its own bound infinite).

#include "kernels/cpu/test_util.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::kernels::cpu::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const std::vector<float> kBase = {0.5f, -1.25f, 3.0f, 0.0f, 7.5f};

std::vector<float> With(size_t index, float value) {
  std::vector<float> v = kBase;
  v[index] = value;
  return v;
}

std::vector<double> Double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(TestUtilTest, FiniteInputsPassAndFailAsTheirBoundsSay) {
  EXPECT_TRUE(BitsEqual(kBase, kBase));
  EXPECT_FALSE(BitsEqual(kBase, With(1, std::nextafter(-1.25f, 0.0f))));
  // Scale 7.5: tol 0.1 allows 0.75; 0.5 passes, 1.0 does not.
  EXPECT_TRUE(CloseToScale(With(0, 1.0f), kBase, 0.1));
  EXPECT_FALSE(CloseToScale(With(0, 1.5f), kBase, 0.1));
  // atol 0.1 + rtol 0.1 * 3 = 0.4 at element 2.
  EXPECT_TRUE(AllClose(With(2, 3.35f), Double(kBase), 0.1, 0.1));
  EXPECT_FALSE(AllClose(With(2, 3.45f), Double(kBase), 0.1, 0.1));
}

TEST(TestUtilTest, EveryComparisonFailsOnNonFiniteValueInEitherInput) {
  for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < kBase.size(); ++i) {
      const std::vector<float> a = With(i, bad);
      EXPECT_FALSE(BitsEqual(a, a)) << bad << " at " << i << " in both";
      EXPECT_FALSE(BitsEqual(a, kBase)) << bad << " at " << i;
      EXPECT_FALSE(BitsEqual(kBase, a)) << bad << " at " << i;
      EXPECT_FALSE(CloseToScale(a, a, 1.0)) << bad << " at " << i << " in both";
      EXPECT_FALSE(CloseToScale(a, kBase, 1.0)) << bad << " at " << i << " in actual";
      EXPECT_FALSE(CloseToScale(kBase, a, 1.0)) << bad << " at " << i << " in expected";
      EXPECT_FALSE(CloseToScale(kBase, Double(a), 1.0)) << bad << " at " << i << " in expected (double)";
      EXPECT_FALSE(AllClose(a, Double(a), 1.0, 1.0)) << bad << " at " << i << " in both";
      EXPECT_FALSE(AllClose(a, Double(kBase), 1.0, 1.0)) << bad << " at " << i << " in actual";
      EXPECT_FALSE(AllClose(kBase, Double(a), 1.0, 1.0)) << bad << " at " << i << " in expected";
    }
  }
}

}  // namespace
}  // namespace hybridserve::kernels::cpu::testing
