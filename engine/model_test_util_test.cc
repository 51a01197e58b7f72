// The comparison helpers of the Model tests fail on non-finite values: a NaN
// or an infinity in either input, at any index, is never a match and never
// within a tolerance (issue 9: std::max(m, NaN) kept m, so NaN logits passed).

#include "engine/model_test_util.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/sequence_state.h"
#include "gtest/gtest.h"

namespace hybridserve::engine::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const std::vector<float> kBase = {0.5f, -1.25f, 3.0f, 0.0f, 7.5f};

// kBase with `value` at `index`.
std::vector<float> With(size_t index, float value) {
  std::vector<float> v = kBase;
  v[index] = value;
  return v;
}

TEST(MaxAbsDiffTest, FiniteInputsGiveTheExactLargestDifference) {
  EXPECT_EQ(MaxAbsDiff(kBase, kBase), 0.0f);
  EXPECT_EQ(MaxAbsDiff(kBase, With(2, 3.5f)), 0.5f);
  EXPECT_EQ(MaxAbsDiff(kBase, {0.5f, -1.25f, 3.0f, 0.0f}), INFINITY) << "sizes differ";
}

TEST(MaxAbsDiffTest, NonFiniteValueInEitherInputAtAnyIndexIsInfinite) {
  for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < kBase.size(); ++i) {
      EXPECT_EQ(MaxAbsDiff(With(i, bad), kBase), INFINITY) << bad << " at " << i << " in a";
      EXPECT_EQ(MaxAbsDiff(kBase, With(i, bad)), INFINITY) << bad << " at " << i << " in b";
      EXPECT_EQ(MaxAbsDiff(With(i, bad), With(i, bad)), INFINITY) << bad << " at " << i << " in both";
      EXPECT_FALSE(MaxAbsDiff(With(i, bad), kBase) <= 1e-4f);
    }
  }
}

TEST(BitEqualTest, SameFiniteBitsAreEqualAndOneBitIsNot) {
  EXPECT_TRUE(BitEqual(kBase, kBase));
  EXPECT_TRUE(BitEqual(std::vector<float>{}, std::vector<float>{}));
  EXPECT_FALSE(BitEqual(kBase, With(2, std::nextafter(3.0f, 4.0f))));
  EXPECT_FALSE(BitEqual(kBase, With(3, -0.0f))) << "-0 and 0 differ in their bits";
  EXPECT_FALSE(BitEqual(kBase, {0.5f, -1.25f, 3.0f, 0.0f}));
}

TEST(BitEqualTest, NonFiniteValueFailsEvenWhenBothInputsHoldTheSameBits) {
  for (float bad : {kNaN, kInf, -kInf}) {
    for (size_t i = 0; i < kBase.size(); ++i) {
      const std::vector<float> a = With(i, bad);
      const ::testing::AssertionResult both = BitEqual(a, a);
      EXPECT_FALSE(both) << bad << " at " << i;
      EXPECT_NE(std::string(both.message()).find("non-finite value at element " + std::to_string(i)), std::string::npos)
          << both.message();
      EXPECT_FALSE(BitEqual(a, kBase)) << bad << " at " << i;
      EXPECT_FALSE(BitEqual(kBase, a)) << bad << " at " << i;
    }
  }
}

SequenceState SmallState() {
  SequenceState s;
  s.position = 3;
  s.ssm_states = {kBase, kBase};
  s.conv_states = {kBase};
  s.tail_k = {kBase};
  s.tail_v = {kBase};
  s.last_logits = kBase;
  return s;
}

TEST(StatesBitEqualTest, NonFiniteValueInAnyFieldFails) {
  std::string what;
  const SequenceState good = SmallState();
  ASSERT_TRUE(StatesBitEqual(good, good, &what)) << what;
  EXPECT_EQ(StatesMaxAbsDiff(good, good), 0.0f);
  for (float bad : {kNaN, kInf}) {
    std::vector<SequenceState> broken(5, good);
    broken[0].ssm_states[1][4] = bad;
    broken[1].conv_states[0][0] = bad;
    broken[2].tail_k[0][2] = bad;
    broken[3].tail_v[0][1] = bad;
    broken[4].last_logits[3] = bad;
    for (size_t f = 0; f < broken.size(); ++f) {
      what.clear();
      EXPECT_FALSE(StatesBitEqual(broken[f], broken[f], &what)) << bad << " in field " << f;
      EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
      EXPECT_FALSE(StatesBitEqual(good, broken[f], &what)) << bad << " in field " << f;
    }
    EXPECT_EQ(StatesMaxAbsDiff(broken[0], good), INFINITY);
    EXPECT_EQ(StatesMaxAbsDiff(good, broken[1]), INFINITY);
  }
}

TEST(StatesMaxAbsDiffTest, DifferentLayerCountsAreInfinitelyFarApart) {
  SequenceState fewer = SmallState();
  fewer.ssm_states.pop_back();
  EXPECT_EQ(StatesMaxAbsDiff(SmallState(), fewer), INFINITY);
  EXPECT_EQ(StatesMaxAbsDiff(fewer, SmallState()), INFINITY);
}

}  // namespace
}  // namespace hybridserve::engine::testing
