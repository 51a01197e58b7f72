#include "cachestore/keys.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

TEST(KeysTest, NamespaceSeparatesEveryPart) {
  Hash128 base = NamespaceKey("fp", "lora", "tenant", 16);
  EXPECT_EQ(base, NamespaceKey("fp", "lora", "tenant", 16));
  EXPECT_NE(base, NamespaceKey("fp2", "lora", "tenant", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora2", "tenant", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora", "tenant2", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora", "tenant", 32));
  // Length prefixes: moving a byte between parts changes the key.
  EXPECT_NE(NamespaceKey("ab", "c", "", 16), NamespaceKey("a", "bc", "", 16));
}

// The derivation written in keys.h and proto/cachestore.proto, byte by byte:
// L(x) = x's length as 8 bytes little-endian, then x; page_size as 4 bytes
// little-endian.
TEST(KeysTest, NamespaceKeyHashesTheDocumentedBytes) {
  auto length_prefixed = [](const std::string& part) {
    std::string out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((uint64_t{part.size()} >> (8 * i)) & 0xff));
    return out + part;
  };
  const int32_t page_size = 0x01020304;  // distinct bytes expose the byte order
  std::string bytes = length_prefixed("hybridserve/ns/v1") + length_prefixed("fp") + length_prefixed("lora") +
                      length_prefixed("tenant");
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((page_size >> (8 * i)) & 0xff));
  EXPECT_EQ(NamespaceKey("fp", "lora", "tenant", page_size), common::HashBytes(bytes));
  EXPECT_NE(NamespaceKey("fp", "lora", "tenant", 16), common::HashBytes(bytes));
}

TEST(KeysTest, PageKeysChainOverFullPagesOnly) {
  Hash128 ns = NamespaceKey("fp", "", "", 4);
  std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<Hash128> keys = PageKeys(ns, tokens, 4);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], PageKey(ns, absl::MakeConstSpan(tokens).subspan(0, 4)));
  EXPECT_EQ(keys[1], PageKey(keys[0], absl::MakeConstSpan(tokens).subspan(4, 4)));
  // A shared prefix shares keys; a different first page changes every key.
  std::vector<TokenId> other = tokens;
  other[9] = 99;
  EXPECT_EQ(PageKeys(ns, other, 4), keys);
  other[0] = 99;
  std::vector<Hash128> changed = PageKeys(ns, other, 4);
  EXPECT_NE(changed[0], keys[0]);
  EXPECT_NE(changed[1], keys[1]);
}

TEST(KeysTest, StateKeysDifferFromPageKeysAndByTail) {
  Hash128 ns = NamespaceKey("fp", "", "", 4);
  std::vector<TokenId> page = {1, 2, 3, 4};
  std::vector<TokenId> tail = {1, 2, 3};
  EXPECT_NE(StateKey(ns, page), PageKey(ns, page));
  EXPECT_NE(StateKey(ns, tail), StateKey(ns, {1, 2}));
  EXPECT_NE(StateKey(ns, {}), StateKey(PageKey(ns, page), {}));
}

}  // namespace
}  // namespace hybridserve::cachestore
