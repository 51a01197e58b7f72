#include "common/metrics.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, ExponentialBuckets) { EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8})); }

TEST(MetricsTest, ExposerBindsFreePortAndReportsIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  EXPECT_GT((*exposer)->port(), 0);
}

TEST(MetricsTest, ExposerReportsBadBindAsStatus) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto exposer = MetricsExposer::Create("not-an-address:99999", registry);
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(exposer.status().message(), HasSubstr("cannot bind not-an-address:99999"));
}

// A port another exposer holds is refused with a status naming the address,
// not shared and not thrown.
TEST(MetricsTest, ExposerRefusesATakenPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsExposer::Create("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = MetricsExposer::Create(taken, registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("cannot bind " + taken));
}

}  // namespace
}  // namespace hybridserve::common
