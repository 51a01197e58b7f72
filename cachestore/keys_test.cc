#include "cachestore/keys.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

TEST(KeysTest, NamespaceSeparatesEveryPart) {
  Hash128 base = NamespaceKey("fp", "lora", "org", "salt", 16);
  EXPECT_EQ(base, NamespaceKey("fp", "lora", "org", "salt", 16));
  EXPECT_NE(base, NamespaceKey("fp2", "lora", "org", "salt", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora2", "org", "salt", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora", "org2", "salt", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora", "org", "salt2", 16));
  EXPECT_NE(base, NamespaceKey("fp", "lora", "org", "salt", 32));
  // Length prefixes: moving a byte between parts changes the key.
  EXPECT_NE(NamespaceKey("ab", "c", "", "", 16), NamespaceKey("a", "bc", "", "", 16));
}

// A client's salt narrows its sharing inside its tenant and never widens it
// into another's: no salt makes one tenant's namespace another's.
TEST(KeysTest, TenantAndSaltNeverCollide) {
  EXPECT_NE(NamespaceKey("fp", "", "org_1", "2345", 16), NamespaceKey("fp", "", "org_12345", "", 16));
  EXPECT_NE(NamespaceKey("fp", "", "org_1", "", 16), NamespaceKey("fp", "", "", "org_1", 16));
  EXPECT_NE(NamespaceKey("fp", "", "a", "b", 16), NamespaceKey("fp", "", "b", "a", 16));
}

TEST(KeysTest, OverlongTenantIsRefused) {
  EXPECT_TRUE(ValidatedNamespaceKey("fp", "", std::string(kMaxTenantBytes, 't'), "", 16).ok());
  const absl::StatusOr<Hash128> key = ValidatedNamespaceKey("fp", "", std::string(kMaxTenantBytes + 1, 't'), "", 16);
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(key.status().message()), ::testing::HasSubstr("tenant has 257 bytes"));
}

// The one model-cost check: none and in-range costs pass; the first field
// out of range is named, with the "namespace.model_cost." prefix every
// caller (service, in-process client, index) answers with.
TEST(KeysTest, ModelCostIsCheckedNamingTheField) {
  EXPECT_TRUE(CheckModelCost(std::nullopt).ok());
  EXPECT_TRUE(CheckModelCost(PrefillCost{0, 0}).ok());
  EXPECT_TRUE(CheckModelCost(PrefillCost{kMaxPrefillFlops, 1024}).ok());
  const absl::Status negative = CheckModelCost(PrefillCost{-1, 0});
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(negative.message()),
            "namespace.model_cost.flops_per_token -1 is not a finite number in [0, 1e+30]");
  const absl::Status context = CheckModelCost(PrefillCost{1, 2e30});
  EXPECT_EQ(context.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(context.message()),
            "namespace.model_cost.flops_per_token_context 2e+30 is not a finite number in [0, 1e+30]");
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
  std::string bytes = length_prefixed("hybridserve/ns/v3") + length_prefixed("fp") + length_prefixed("lora") +
                      length_prefixed("org") + length_prefixed("salt");
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((page_size >> (8 * i)) & 0xff));
  EXPECT_EQ(NamespaceKey("fp", "lora", "org", "salt", page_size), common::HashBytes(bytes));
  EXPECT_NE(NamespaceKey("fp", "lora", "org", "salt", 16), common::HashBytes(bytes));
}

TEST(KeysTest, PageKeysChainOverFullPagesOnly) {
  Hash128 ns = NamespaceKey("fp", "", "", "", 4);
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

// Version 2: K_i = H(K_{i-1} || C_i) with C_i = H(page tokens), byte by byte.
TEST(KeysTest, PageKeyChainsTheContentHash) {
  const Hash128 ns = NamespaceKey("fp", "", "", "", 4);
  const std::vector<TokenId> page = {5, 6, 7, 8};
  const Hash128 content = common::HashBytes(page.data(), page.size() * sizeof(TokenId));
  EXPECT_EQ(PageContentKey(page), content);
  EXPECT_EQ(PageKey(ns, page), common::HashBytes(ns.ToBytes() + content.ToBytes()));
}

// Only the current key derivation is served; an older or unknown one is
// refused by a message that names both versions.
TEST(KeysTest, OtherKeyVersionsAreRefusedByName) {
  EXPECT_TRUE(ValidatedNamespaceKey("fp", "", "", "", 16, 0).ok());
  EXPECT_TRUE(ValidatedNamespaceKey("fp", "", "", "", 16, kKeyVersion).ok());
  absl::StatusOr<Hash128> v1 = ValidatedNamespaceKey("fp", "", "", "", 16, 1);
  EXPECT_EQ(v1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v1.status().message()),
              ::testing::HasSubstr("key_version 1 (tokens chained page by page) is no longer served"));
  EXPECT_THAT(std::string(ValidatedNamespaceKey("fp", "", "", "", 16, 2).status().message()),
              ::testing::HasSubstr("key_version 2 (no tenant in the namespace) is no longer served"));
  EXPECT_THAT(std::string(ValidatedNamespaceKey("fp", "", "", "", 16, 4).status().message()),
              ::testing::HasSubstr("key_version 4 is unknown: this cachestore derives keys with version 3"));
}

TEST(KeysTest, StateKeysDifferFromPageKeysAndByTail) {
  Hash128 ns = NamespaceKey("fp", "", "", "", 4);
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
  EXPECT_EQ(NamespaceKey("fp", "lora", "org_1", "2345", 16).ToHex(), "7d80a91fbe614b24fc23f32d292c6bd8");
  EXPECT_EQ(NamespaceKey("fp", "lora", "org_12345", "", 16).ToHex(), "fe406f070b45746f2b7fdd8a74f984e6");
  EXPECT_EQ(NamespaceKey("model-a", "", "", "", 0x01020304).ToHex(), "91119244d72296959d97b79aa260bf5e");
  EXPECT_EQ(NamespaceKey("fp", "", "", "", 4).ToHex(), "3e99935bd613565233a22bed9025542a");
}

TEST(KeysTest, PageAndStateKeysMatchIndependentlyComputedValues) {
  const Hash128 ns = NamespaceKey("fp", "", "", "", 4);
  // Token ids with distinct bytes expose the byte order.
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 0x01020304, 2147483647, 0, 7, 9, 10};
  const auto span = absl::MakeConstSpan(tokens);
  std::vector<Hash128> pages = PageKeys(ns, tokens, 4);
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(pages[0].ToHex(), "54cace1ffec38c6dd3f89ebae3adb6e9");
  EXPECT_EQ(pages[1].ToHex(), "f706628613eee11cc3f5677caae9f514");
  // The wire form: the 128-bit value little-endian (lo's bytes, then hi's).
  std::string wire;
  for (int i = 0; i < 16; ++i) {
    absl::StrAppend(&wire, absl::Hex(static_cast<uint8_t>(pages[0].ToBytes()[i]), absl::kZeroPad2));
  }
  EXPECT_EQ(wire, "e9b6ade3ba9ef8d36d8cc3fe1fceca54");
  // S_p hangs from K_{n-1} (N when n = 0) with the tail tokens[n*4, p).
  EXPECT_EQ(StateKey(ns, span.subspan(0, 0)).ToHex(), "6497b8ff6d25371546c366e98d214c09");        // p = 0
  EXPECT_EQ(StateKey(ns, span.subspan(0, 3)).ToHex(), "35a583f08fcb6b521c8e41f44d4d6bdb");        // p = 3
  EXPECT_EQ(StateKey(pages[0], span.subspan(4, 0)).ToHex(), "e1348cdfff68054264556386435fd7a6");  // p = 4
  EXPECT_EQ(StateKey(pages[1], span.subspan(8, 0)).ToHex(), "e3aad68237dedb39dff99ed9d5c01be8");  // p = 8
  EXPECT_EQ(StateKey(pages[1], span.subspan(8, 2)).ToHex(), "9d7ddec2f836e6073059bf69c38c6ec2");  // p = 10
}

}  // namespace
}  // namespace hybridserve::cachestore
