#include "transport/transfer_secret.h"

#include <set>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace hybridserve::transport {
namespace {

TEST(TransferSecretTest, SecretsAreSixteenBytesAndDoNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> s = NewTransferSecret();
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->size(), kTransferSecretBytes);
    EXPECT_TRUE(seen.insert(*s).second) << "secret " << i << " repeats an earlier one";
  }
  // Every byte position takes many values (a constant or counter-like byte
  // would not): 1000 draws of a uniform byte hit far more than 100 values.
  for (size_t b = 0; b < kTransferSecretBytes; ++b) {
    std::set<char> values;
    for (const std::string& s : seen) values.insert(s[b]);
    EXPECT_GT(values.size(), 100u) << "byte " << b;
  }
  EXPECT_EQ(RandomSecret(0)->size(), 0u);
  EXPECT_EQ(RandomSecret(256)->size(), 256u);
  EXPECT_EQ(RandomSecret(257).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransferSecretTest, SecretsEqualOnlyWhenEveryByteIs) {
  const std::string a = "0123456789abcdef";
  EXPECT_TRUE(SecretsEqual(a, a));
  EXPECT_TRUE(SecretsEqual("", ""));
  for (size_t i = 0; i < a.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string b = a;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      EXPECT_FALSE(SecretsEqual(a, b)) << "byte " << i << " bit " << bit;
    }
  }
  EXPECT_FALSE(SecretsEqual(a, a.substr(0, 15)));
  EXPECT_FALSE(SecretsEqual(a, a + "0"));
  EXPECT_FALSE(SecretsEqual(a, ""));
}

}  // namespace
}  // namespace hybridserve::transport
