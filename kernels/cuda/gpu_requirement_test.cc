#include "kernels/cuda/gpu_requirement.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace hybridserve::kernels::cuda_testing {
namespace {

using ::testing::HasSubstr;
using ::testing::TestPartResult;
using ::testing::TestPartResultArray;

// Sets HS_REQUIRE_GPUS for its lifetime (null: unset), then restores it.
class ScopedRequiredGpus {
 public:
  explicit ScopedRequiredGpus(const char* value) {
    if (const char* old = std::getenv("HS_REQUIRE_GPUS")) {
      old_ = old;
      had_ = true;
    }
    if (value != nullptr) {
      setenv("HS_REQUIRE_GPUS", value, 1);
    } else {
      unsetenv("HS_REQUIRE_GPUS");
    }
  }
  ~ScopedRequiredGpus() {
    if (had_) {
      setenv("HS_REQUIRE_GPUS", old_.c_str(), 1);
    } else {
      unsetenv("HS_REQUIRE_GPUS");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

// HaveGpusOrSkip's answer and the one result it recorded (a skip or a
// failure), intercepted so that this test itself neither skips nor fails.
struct Outcome {
  bool have = false;
  int results = 0;
  TestPartResult::Type type = TestPartResult::kSuccess;
  std::string message;
};
Outcome Check(int needed, int found, const char* why = nullptr) {
  TestPartResultArray recorded;
  Outcome o;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &recorded);
    o.have = HaveGpusOrSkip(needed, found, why);
  }
  o.results = recorded.size();
  if (o.results > 0) {
    o.type = recorded.GetTestPartResult(0).type();
    o.message = recorded.GetTestPartResult(0).message();
  }
  return o;
}

TEST(GpuRequirementTest, EnoughGpusRunWhateverIsRequired) {
  ScopedRequiredGpus required("1");
  for (const auto& [needed, found] : {std::pair{1, 1}, std::pair{2, 8}}) {
    const Outcome o = Check(needed, found);
    EXPECT_TRUE(o.have);
    EXPECT_EQ(o.results, 0);
  }
}

// The outcome of a test that lacked GPUs: one recorded result of `type` whose message holds `says`.
void ExpectOneResult(const Outcome& o, TestPartResult::Type type, const std::string& says) {
  EXPECT_FALSE(o.have);
  ASSERT_EQ(o.results, 1);
  EXPECT_EQ(o.type, type);
  EXPECT_THAT(o.message, HasSubstr(says));
}

TEST(GpuRequirementTest, WithoutARequirementTooFewGpusSkipSayingWhy) {
  ScopedRequiredGpus required(nullptr);
  ExpectOneResult(Check(1, 0, "the kernels"), TestPartResult::kSkip,
                  "needs 1 CUDA device (the kernels) and this machine has 0 (no driver or no GPU)");
}

TEST(GpuRequirementTest, AMissingDeclaredGpuFails) {
  ScopedRequiredGpus required("1");
  ExpectOneResult(Check(1, 0), TestPartResult::kFatalFailure, "HS_REQUIRE_GPUS=1 but this machine has 0");
}

TEST(GpuRequirementTest, ATestNeedingMoreGpusThanDeclaredStillSkips) {
  ScopedRequiredGpus required("1");
  ExpectOneResult(Check(2, 1, "NCCL"), TestPartResult::kSkip, "needs 2 CUDA devices (NCCL) and this machine has 1");
}

TEST(GpuRequirementTest, ABrokenCudaSetupFailsEvenWithoutARequirement) {
  ScopedRequiredGpus required(nullptr);
  ExpectOneResult(Check(1, -35), TestPartResult::kFatalFailure, "CUDA error 35 while counting devices");
}

TEST(GpuRequirementTest, AMalformedRequirementFails) {
  ScopedRequiredGpus required("one");
  EXPECT_NONFATAL_FAILURE(EXPECT_EQ(RequiredGpus(), 0), "is not a GPU count");
}

}  // namespace
}  // namespace hybridserve::kernels::cuda_testing
