#include "cachestore/client/shard_placement.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace hybridserve::cachestore {

using common::Hash128;

namespace {

uint64_t SeedOf(absl::string_view shard) { return XXH3_64bits(shard.data(), shard.size()); }

uint64_t WeightWithSeed(uint64_t seed, const Hash128& ns, const Hash128& first_page_key) {
  // N then K_0, each lo then hi, little-endian (Hash128::ToBytes).
  unsigned char bytes[32];
  const uint64_t words[4] = {ns.lo, ns.hi, first_page_key.lo, first_page_key.hi};
  for (int w = 0; w < 4; ++w) {
    for (int b = 0; b < 8; ++b) bytes[w * 8 + b] = static_cast<unsigned char>(words[w] >> (8 * b));
  }
  return XXH3_64bits_withSeed(bytes, sizeof(bytes), seed);
}

}  // namespace

absl::StatusOr<ShardPlacement> ShardPlacement::Create(std::vector<std::string> shards) {
  if (shards.empty()) return absl::InvalidArgumentError("shards: the list is empty");
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].empty()) return absl::InvalidArgumentError(absl::StrCat("shards[", i, "]: the name is empty"));
  }
  std::sort(shards.begin(), shards.end());
  auto dup = std::adjacent_find(shards.begin(), shards.end());
  if (dup != shards.end()) {
    return absl::InvalidArgumentError(absl::StrCat("shards: \"", *dup, "\" is listed more than once"));
  }
  std::vector<uint64_t> seeds;
  seeds.reserve(shards.size());
  for (const std::string& s : shards) seeds.push_back(SeedOf(s));
  return ShardPlacement(std::move(shards), std::move(seeds));
}

uint64_t ShardPlacement::Weight(absl::string_view shard, const Hash128& ns, const Hash128& first_page_key) {
  return WeightWithSeed(SeedOf(shard), ns, first_page_key);
}

uint64_t ShardPlacement::WeightOf(size_t i, const Hash128& ns, const Hash128& first_page_key) const {
  return WeightWithSeed(seeds_[i], ns, first_page_key);
}

bool ShardPlacement::RanksBefore(uint64_t weight_a, absl::string_view a, uint64_t weight_b, absl::string_view b) {
  if (weight_a != weight_b) return weight_a > weight_b;
  return a < b;
}

const std::string& ShardPlacement::Owner(const Hash128& ns, const Hash128& first_page_key) const {
  size_t best = 0;
  uint64_t best_weight = WeightOf(0, ns, first_page_key);
  for (size_t i = 1; i < shards_.size(); ++i) {
    const uint64_t w = WeightOf(i, ns, first_page_key);
    if (RanksBefore(w, shards_[i], best_weight, shards_[best])) {
      best = i;
      best_weight = w;
    }
  }
  return shards_[best];
}

std::vector<absl::string_view> ShardPlacement::Ranked(const Hash128& ns, const Hash128& first_page_key) const {
  std::vector<std::pair<uint64_t, size_t>> weighted;
  weighted.reserve(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) weighted.emplace_back(WeightOf(i, ns, first_page_key), i);
  std::sort(weighted.begin(), weighted.end(), [this](const auto& a, const auto& b) {
    return RanksBefore(a.first, shards_[a.second], b.first, shards_[b.second]);
  });
  std::vector<absl::string_view> ranked;
  ranked.reserve(weighted.size());
  for (const auto& [weight, i] : weighted) ranked.push_back(shards_[i]);
  return ranked;
}

Hash128 ShardPlacement::ChainKey(const Hash128& ns, absl::Span<const Hash128> page_keys) {
  return page_keys.empty() ? ns : page_keys[0];
}

}  // namespace hybridserve::cachestore
