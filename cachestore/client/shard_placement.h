#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_SHARD_PLACEMENT_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_SHARD_PLACEMENT_H_

// Which cachestore shard owns a prefix chain (issue 49, "Shards"): rendezvous
// (highest-random-weight) hashing over the configured shard names. Built, not
// yet used by any client or server.
//
// What is hashed. A prompt's chain is placed by two keys of cachestore/keys.h:
//   N    the namespace key (NamespaceKey: fingerprint, adapter, tenant, salt,
//        page size), the root K_{-1} of every chain in the namespace;
//   K_0  the chain's first page key, H(N || C_0), a function of N and the
//        prompt's first page_size tokens (ChainKey: N itself when the prompt
//        has no full page).
// A shard's weight for the chain is
//   W(shard) = XXH3-64(N.ToBytes() || K_0.ToBytes(), seed = XXH3-64(name))
// over those 32 bytes (each key 16 bytes, lo then hi, little-endian: the wire
// form), the seed being the XXH3-64 of the shard's name as configured (its
// bytes, no normalisation: every worker must spell a shard the same way). The
// highest weight owns the chain; equal weights rank by name, smaller first, so
// the owner is a pure function of (N, K_0, the set of names), whatever the
// list's order. Adding a shard moves only the chains whose new weight beats
// their old owner's (about 1/(n+1) of them, all to the new shard); removing one
// moves only its own chains, each to its second-ranked shard (Ranked()[1]).
// ShardPlacementTest.KnownAnswers pins this function: changing it is a format
// change that re-homes every cached chain.
//
// Why one shard holds every entry a prompt's lookup can use. Every page key
// K_i (i >= 0) chains from K_0 (K_i = H(K_{i-1} || C_i)), and every state
// S_p of the chain, a prefill grid checkpoint or prompt-end state or decode's
// turn-end state, hangs from K_{n-1} (n = floor(p / page_size)) or from N. A
// worker computes K_0 from the prompt's first page before any call, places the
// lookup and every put of that prompt on Owner(N, K_0), and any later prompt
// that extends it (the next turn of the conversation) has the same first page,
// hence the same K_0 and the same shard: the lookup is one call to one shard.
// N is hashed beside K_0 (which already chains from it) so that one rule
// places both chains and the prompts shorter than a page, by (N, N).
// Consequences: prompts that share a first page share a shard, so a fleet
// whose prompts mostly open with the same long system prompt (a page or more)
// is not spread over the shards at all; the states of a prompt shorter than
// one page are placed by (N, N), so a conversation whose first turn was
// shorter than a page finds them no more once it passes one page (a miss of
// fewer than page_size tokens).
//
// Immutable after Create; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash.h"

namespace hybridserve::cachestore {

class ShardPlacement {
 public:
  // `shards`: the shards' names as configured (host:port), in any order.
  // INVALID_ARGUMENT for an empty list, an empty name (naming its index) or a
  // name listed twice (naming it).
  static absl::StatusOr<ShardPlacement> Create(std::vector<std::string> shards);

  // The names, sorted.
  const std::vector<std::string>& shards() const { return shards_; }

  // The shard that owns the chain of namespace key `ns` whose first page key is
  // `first_page_key` (ChainKey). The reference lives as long as the placement.
  const std::string& Owner(const common::Hash128& ns, const common::Hash128& first_page_key) const;

  // Every shard, best first: Ranked()[0] is Owner(), Ranked()[1] the owner
  // once Ranked()[0] is removed, and so on. The views live as long as the
  // placement.
  std::vector<absl::string_view> Ranked(const common::Hash128& ns, const common::Hash128& first_page_key) const;

  // W(shard) above.
  static uint64_t Weight(absl::string_view shard, const common::Hash128& ns, const common::Hash128& first_page_key);

  // Whether (weight_a, a) ranks before (weight_b, b): the higher weight, then
  // the smaller name.
  static bool RanksBefore(uint64_t weight_a, absl::string_view a, uint64_t weight_b, absl::string_view b);

  // The key a prompt is placed by: its first page key (page_keys[0], as
  // PageKeys or CachePlan::page_keys give them), or `ns` when it has no full
  // page.
  static common::Hash128 ChainKey(const common::Hash128& ns, absl::Span<const common::Hash128> page_keys);

 private:
  ShardPlacement(std::vector<std::string> shards, std::vector<uint64_t> seeds)
      : shards_(std::move(shards)), seeds_(std::move(seeds)) {}

  uint64_t WeightOf(size_t i, const common::Hash128& ns, const common::Hash128& first_page_key) const;

  std::vector<std::string> shards_;  // sorted
  std::vector<uint64_t> seeds_;      // seeds_[i] = XXH3-64(shards_[i])
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_SHARD_PLACEMENT_H_
