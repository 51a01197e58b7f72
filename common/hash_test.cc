#include "common/hash.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::common {
namespace {

TEST(HashTest, Xxh3KnownValueOfEmptyInput) {
  // XXH3_64bits("") from the xxHash reference test vectors.
  EXPECT_EQ(Checksum64("", 0), 0x2D06800538D394C2ULL);
}

TEST(HashTest, ChainDependsOnPrevAndData) {
  std::vector<int32_t> page = {1, 2, 3, 4};
  Hash128 root = HashBytes("ns");
  Hash128 a = HashChain(root, page.data(), page.size() * 4);
  EXPECT_EQ(a, HashChain(root, page.data(), page.size() * 4));
  EXPECT_NE(a, HashChain(HashBytes("other"), page.data(), page.size() * 4));
  page[3] = 5;
  EXPECT_NE(a, HashChain(root, page.data(), page.size() * 4));
}

TEST(HashTest, ChainOfLargeInputMatchesOneShotHashOfConcatenation) {
  std::string data(10000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  Hash128 prev{0x1122334455667788ULL, 0x99aabbccddeeff00ULL};
  std::string concat = prev.ToBytes() + data;
  EXPECT_EQ(HashChain(prev, data.data(), data.size()), HashBytes(concat));
  // The small-input path hashes the same concatenation.
  EXPECT_EQ(HashChain(prev, data.data(), 100), HashBytes(concat.substr(0, 116)));
}

TEST(HashTest, StreamingChecksumEqualsOneShot) {
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  StreamingChecksum sum;
  for (size_t off = 0; off < data.size(); off += 4097) {
    sum.Update(data.data() + off, std::min<size_t>(4097, data.size() - off));
  }
  EXPECT_EQ(sum.Digest(), Checksum64(data.data(), data.size()));
}

// Every prefix digest of a ChainHasher equals the one-shot HashChain of that
// prefix, across both of HashChain's paths (small and large inputs) and
// across pieces that split XXH3's internal stripes.
TEST(HashTest, ChainHasherDigestsEveryPrefixLikeHashChain) {
  std::string data(9000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 1);
  const Hash128 prev{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  ChainHasher chained(prev);
  EXPECT_EQ(chained.Digest(), HashChain(prev, nullptr, 0));
  size_t done = 0;
  for (size_t piece : {1, 3, 60, 4, 176, 240, 1, 1024, 2500, 4991}) {
    chained.Update(data.data() + done, piece);
    done += piece;
    ASSERT_EQ(chained.Digest(), HashChain(prev, data.data(), done)) << "prefix of " << done << " bytes";
  }
  EXPECT_EQ(done, data.size());
}

TEST(HashTest, BytesRoundTrip) {
  Hash128 h = HashBytes("round trip");
  Hash128 back;
  ASSERT_TRUE(Hash128::FromBytes(h.ToBytes(), &back));
  EXPECT_EQ(h, back);
  EXPECT_FALSE(Hash128::FromBytes("short", &back));
  EXPECT_EQ(h.ToHex().size(), 32u);
}

}  // namespace
}  // namespace hybridserve::common
