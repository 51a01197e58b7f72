#include "cachestore/keys.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Known answers: the keys exactly as proto/cachestore.proto defines them,
// computed independently with Python's xxhash by
// tools/cache_key_known_answers.py (its output, hi then lo as ToHex() writes
// them). A change of the wire format of any key fails here.
TEST(KeysTest, NamespaceKeysMatchIndependentlyComputedValues) {
  EXPECT_EQ(NamespaceKey("fp", "lora", "tenant", 16).ToHex(), "afc7eb3f5f0d6c86a2faf3e6a973b8fb");
  EXPECT_EQ(NamespaceKey("model-a", "", "", 0x01020304).ToHex(), "e2f03f3e83c946fb2ffe7fbbea5de550");
  EXPECT_EQ(NamespaceKey("fp", "", "", 4).ToHex(), "24f876541a802ba37b393917dff6151f");
}

TEST(KeysTest, PageAndStateKeysMatchIndependentlyComputedValues) {
  const Hash128 ns = NamespaceKey("fp", "", "", 4);
  // Token ids with distinct bytes expose the byte order.
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 0x01020304, 2147483647, 0, 7, 9, 10};
  const auto span = absl::MakeConstSpan(tokens);
  std::vector<Hash128> pages = PageKeys(ns, tokens, 4);
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(pages[0].ToHex(), "dae3b6da43f006b557c15981e38fbca2");
  EXPECT_EQ(pages[1].ToHex(), "a5c579a367bbd64be81f32b4a5a66cee");
  // The wire form: the 128-bit value little-endian (lo's bytes, then hi's).
  std::string wire;
  for (int i = 0; i < 16; ++i) {
    absl::StrAppend(&wire, absl::Hex(static_cast<uint8_t>(pages[0].ToBytes()[i]), absl::kZeroPad2));
  }
  EXPECT_EQ(wire, "a2bc8fe38159c157b506f043dab6e3da");
  // S_p hangs from K_{n-1} (N when n = 0) with the tail tokens[n*4, p).
  EXPECT_EQ(StateKey(ns, span.subspan(0, 0)).ToHex(), "86bdddf9e56da099c601b9c29444a9db");        // p = 0
  EXPECT_EQ(StateKey(ns, span.subspan(0, 3)).ToHex(), "ca72860cd8f62372f5c6097c8e37da16");        // p = 3
  EXPECT_EQ(StateKey(pages[0], span.subspan(4, 0)).ToHex(), "7c3a53bc25bbfc6573998b92263410b4");  // p = 4
  EXPECT_EQ(StateKey(pages[1], span.subspan(8, 0)).ToHex(), "00de2604a0ace2ba5eafe2dbdbda03fa");  // p = 8
  EXPECT_EQ(StateKey(pages[1], span.subspan(8, 2)).ToHex(), "12340c3780fc0dd365761eb354337bb0");  // p = 10
}

}  // namespace
}  // namespace hybridserve::cachestore
