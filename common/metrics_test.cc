#include "common/metrics.h"

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

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
  EXPECT_FALSE(exposer.ok());
}

}  // namespace
}  // namespace hybridserve::common
