#include "cachestore/client/shard_placement.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cachestore/keys.h"
#include "common/hash.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

using common::Hash128;

struct Chain {
  Hash128 ns;
  Hash128 first_page_key;
};

// The names a StatefulSet's shards get behind a headless Service: they differ in
// one character, which is what a weakly keyed hash would fail on.
std::vector<std::string> ShardNames(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(absl::StrCat("cachestore-", i, ".cachestore.hybridserve.svc:7000"));
  return names;
}

// Ranked() as strings, which gtest prints readably.
std::vector<std::string> RankedNames(const ShardPlacement& placement, const Chain& c) {
  const std::vector<absl::string_view> ranked = placement.Ranked(c.ns, c.first_page_key);
  return std::vector<std::string>(ranked.begin(), ranked.end());
}

ShardPlacement MustCreate(std::vector<std::string> names) {
  absl::StatusOr<ShardPlacement> placement = ShardPlacement::Create(std::move(names));
  EXPECT_TRUE(placement.ok()) << placement.status();
  return *std::move(placement);
}

// `count` chains as workers would place them: four namespaces (two tenants, two
// page sizes), each chain's first page key derived from random tokens.
std::vector<Chain> RandomChains(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Hash128 namespaces[4] = {
      NamespaceKey("fp-a", "", "tenant-1", "", 16), NamespaceKey("fp-a", "", "tenant-2", "", 16),
      NamespaceKey("fp-a", "", "tenant-1", "", 64), NamespaceKey("fp-b", "lora", "", "salt", 16)};
  std::vector<Chain> chains;
  chains.reserve(count);
  std::vector<TokenId> page(16);
  for (int c = 0; c < count; ++c) {
    const Hash128& ns = namespaces[rng() % 4];
    for (TokenId& t : page) t = static_cast<TokenId>(rng() % 150000);
    chains.push_back({ns, PageKey(ns, page)});
  }
  return chains;
}

TEST(ShardPlacementTest, RefusesAnEmptyListEmptyNamesAndDuplicates) {
  absl::StatusOr<ShardPlacement> empty = ShardPlacement::Create({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "shards: the list is empty");

  absl::StatusOr<ShardPlacement> empty_name = ShardPlacement::Create({"a:1", "", "b:1"});
  EXPECT_EQ(empty_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty_name.status().message(), "shards[1]: the name is empty");

  absl::StatusOr<ShardPlacement> duplicate = ShardPlacement::Create({"b:1", "a:1", "c:1", "a:1"});
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(duplicate.status().message(), "shards: \"a:1\" is listed more than once");
}

TEST(ShardPlacementTest, OneShardOwnsEverything) {
  ShardPlacement placement = MustCreate({"only:7000"});
  for (const Chain& c : RandomChains(100, 1)) {
    EXPECT_EQ(placement.Owner(c.ns, c.first_page_key), "only:7000");
    EXPECT_EQ(RankedNames(placement, c), std::vector<std::string>{"only:7000"});
  }
}

TEST(ShardPlacementTest, DeterministicAndIndependentOfTheListsOrder) {
  std::vector<std::string> names = ShardNames(5);
  ShardPlacement reference = MustCreate(names);
  const std::vector<Chain> chains = RandomChains(2000, 2);
  std::vector<std::vector<std::string>> expected;
  for (const Chain& c : chains) expected.push_back(RankedNames(reference, c));

  std::mt19937_64 rng(3);
  for (int permutation = 0; permutation < 10; ++permutation) {
    std::shuffle(names.begin(), names.end(), rng);
    ShardPlacement shuffled = MustCreate(names);
    for (size_t i = 0; i < chains.size(); ++i) {
      const Chain& c = chains[i];
      ASSERT_EQ(shuffled.Owner(c.ns, c.first_page_key), reference.Owner(c.ns, c.first_page_key))
          << "chain " << i << ", permutation " << permutation;
      ASSERT_EQ(RankedNames(shuffled, c), expected[i]) << "chain " << i << ", permutation " << permutation;
    }
  }
  // The same inputs, asked again: the same answers.
  for (size_t i = 0; i < chains.size(); ++i) {
    EXPECT_EQ(RankedNames(reference, chains[i]), expected[i]);
  }
}

TEST(ShardPlacementTest, EqualWeightsRankByNameSmallerFirst) {
  // 64-bit weights of distinct names tie with probability ~2^-64, so the tie
  // rule is checked here, where the placement's order is decided.
  EXPECT_TRUE(ShardPlacement::RanksBefore(7, "a:1", 7, "b:1"));
  EXPECT_FALSE(ShardPlacement::RanksBefore(7, "b:1", 7, "a:1"));
  EXPECT_FALSE(ShardPlacement::RanksBefore(7, "a:1", 7, "a:1"));
  EXPECT_TRUE(ShardPlacement::RanksBefore(8, "b:1", 7, "a:1"));
  EXPECT_FALSE(ShardPlacement::RanksBefore(7, "a:1", 8, "b:1"));
}

// These values pin the placement function (the bytes hashed and the hash):
// changing it re-homes every cached chain, so a change must show up here as a
// deliberate format change. Computed by this code once.
TEST(ShardPlacementTest, KnownAnswers) {
  const Hash128 ns = NamespaceKey("fp-known", "", "tenant-1", "", 16);
  std::vector<TokenId> page(16);
  for (int i = 0; i < 16; ++i) page[i] = 100 + i;
  const Hash128 first = PageKey(ns, page);

  EXPECT_EQ(ShardPlacement::Weight("cachestore-0:7000", ns, first), 0x7fbe9ecc14c811dbULL);
  EXPECT_EQ(ShardPlacement::Weight("cachestore-1:7000", ns, first), 0x7a2f03a4671a6060ULL);
  EXPECT_EQ(ShardPlacement::Weight("cachestore-2:7000", ns, first), 0xb21c2a836245cf5dULL);
  // A prompt shorter than a page is placed by (N, N).
  EXPECT_EQ(ShardPlacement::Weight("cachestore-0:7000", ns, ns), 0xfa17283ba97336dfULL);
  // The weight of all-zero keys, independent of keys.h; also checked outside
  // this code, by libxxhash through Python's ctypes:
  // XXH3_64bits_withSeed(32 zero bytes, XXH3_64bits("a:1")).
  EXPECT_EQ(ShardPlacement::Weight("a:1", Hash128{}, Hash128{}), 0xc6f87a8c0f0f54bfULL);

  ShardPlacement placement = MustCreate({"cachestore-0:7000", "cachestore-1:7000", "cachestore-2:7000"});
  EXPECT_EQ(placement.Owner(ns, first), "cachestore-2:7000");
  EXPECT_EQ(RankedNames(placement, {ns, first}),
            (std::vector<std::string>{"cachestore-2:7000", "cachestore-0:7000", "cachestore-1:7000"}));
  EXPECT_EQ(placement.Owner(ns, ns), "cachestore-0:7000");
}

TEST(ShardPlacementTest, ChainKeyIsTheFirstPageKeyOrTheRoot) {
  const Hash128 ns = NamespaceKey("fp", "", "", "", 4);
  std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<Hash128> keys = PageKeys(ns, tokens, 4);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(ShardPlacement::ChainKey(ns, keys), PageKey(ns, {1, 2, 3, 4}));
  EXPECT_EQ(ShardPlacement::ChainKey(ns, {}), ns);
  // Every longer prompt with the same first page has the same chain key: its
  // pages, checkpoints and turn-end states go to one shard.
  tokens.push_back(10);
  EXPECT_EQ(ShardPlacement::ChainKey(ns, PageKeys(ns, tokens, 4)), ShardPlacement::ChainKey(ns, keys));
}

// Each shard's share of 100k chains is within ±3 % of 1/N (relative). The
// count of one shard is binomial(100000, 1/N): its standard deviation is
// sqrt(100000 p (1 - p)), 158 chains (0.32 % of the share) at N = 2 and 105
// (0.84 %) at N = 8, so ±3 % is at least 3.6 sigma for every N here: a fair
// hash stays inside, a biased one (a few % off) does not.
TEST(ShardPlacementTest, SharesAreUniformFor2To8Shards) {
  constexpr int kChains = 100000;
  const std::vector<Chain> chains = RandomChains(kChains, 4);
  for (int n = 2; n <= 8; ++n) {
    ShardPlacement placement = MustCreate(ShardNames(n));
    std::map<std::string, int> counts;
    for (const Chain& c : chains) ++counts[placement.Owner(c.ns, c.first_page_key)];
    ASSERT_EQ(counts.size(), static_cast<size_t>(n)) << "every shard owns some chains, n=" << n;
    const double expected = static_cast<double>(kChains) / n;
    for (const auto& [shard, count] : counts) {
      EXPECT_NEAR(count, expected, 0.03 * expected) << shard << " of " << n << " shards";
    }
  }
}

// Adding a shard to N moves chains only to the new shard, and 1/(N+1) of them
// within ±3 % relative (binomial again: at least 3.6 sigma, as above).
// Removing a shard moves only its own chains, each to its second-ranked shard.
TEST(ShardPlacementTest, AddingOrRemovingAShardMovesOnlyItsChains) {
  constexpr int kChains = 100000;
  const std::vector<Chain> chains = RandomChains(kChains, 5);
  for (int n = 2; n <= 7; ++n) {
    std::vector<std::string> names = ShardNames(n + 1);
    const std::string added = names.back();
    ShardPlacement before = MustCreate(std::vector<std::string>(names.begin(), names.end() - 1));
    ShardPlacement after = MustCreate(names);
    int moved = 0;
    int moved_elsewhere = 0;
    for (const Chain& c : chains) {
      const std::string& old_owner = before.Owner(c.ns, c.first_page_key);
      const std::string& new_owner = after.Owner(c.ns, c.first_page_key);
      if (old_owner == new_owner) continue;
      ++moved;
      if (new_owner != added) ++moved_elsewhere;
    }
    EXPECT_EQ(moved_elsewhere, 0) << "adding shard " << n << " moved chains between old shards";
    const double expected = static_cast<double>(kChains) / (n + 1);
    EXPECT_NEAR(moved, expected, 0.03 * expected) << "adding a shard to " << n;

    // Removing each shard of the n + 1 in turn.
    for (const std::string& removed : names) {
      std::vector<std::string> rest;
      for (const std::string& s : names) {
        if (s != removed) rest.push_back(s);
      }
      ShardPlacement smaller = MustCreate(rest);
      int wrongly_moved = 0;
      for (int i = 0; i < kChains; i += 10) {  // a tenth of the chains per removal
        const Chain& c = chains[i];
        const std::vector<absl::string_view> ranked = after.Ranked(c.ns, c.first_page_key);
        const std::string& owner = smaller.Owner(c.ns, c.first_page_key);
        const absl::string_view expected_owner = ranked[0] == removed ? ranked[1] : ranked[0];
        if (owner != expected_owner) ++wrongly_moved;
      }
      EXPECT_EQ(wrongly_moved, 0) << "removing " << removed << " from " << n + 1;
    }
  }
}

TEST(ShardPlacementTest, RankedStartsWithTheOwnerAndItsSecondOwnsOnceTheOwnerIsGone) {
  const std::vector<std::string> names = ShardNames(6);
  ShardPlacement placement = MustCreate(names);
  for (const Chain& c : RandomChains(2000, 6)) {
    const std::vector<std::string> ranked = RankedNames(placement, c);
    ASSERT_EQ(ranked.size(), names.size());
    EXPECT_EQ(ranked[0], placement.Owner(c.ns, c.first_page_key));
    std::vector<std::string> sorted = ranked;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, placement.shards()) << "every shard once";
    for (size_t i = 1; i < ranked.size(); ++i) {
      EXPECT_TRUE(ShardPlacement::RanksBefore(ShardPlacement::Weight(ranked[i - 1], c.ns, c.first_page_key),
                                              ranked[i - 1], ShardPlacement::Weight(ranked[i], c.ns, c.first_page_key),
                                              ranked[i]));
    }
    std::vector<std::string> without_owner;
    for (const std::string& s : names) {
      if (s != ranked[0]) without_owner.push_back(s);
    }
    ShardPlacement survivors = MustCreate(without_owner);
    EXPECT_EQ(survivors.Owner(c.ns, c.first_page_key), ranked[1]);
    EXPECT_EQ(RankedNames(survivors, c), std::vector<std::string>(ranked.begin() + 1, ranked.end()));
  }
}

}  // namespace
}  // namespace hybridserve::cachestore
