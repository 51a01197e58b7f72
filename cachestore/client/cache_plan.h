#ifndef HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PLAN_H_
#define HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PLAN_H_

// The cache keys of one prompt in one namespace (cachestore/keys.h): its page
// chain, and for any position p the parent and tail of a state at p and the
// state's key, which is also the snapshot's token-prefix hash (it names the
// namespace and tokens[0, p)). Value type; thread-compatible.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "cachestore/cache_client.h"
#include "cachestore/keys.h"
#include "common/hash.h"

namespace hybridserve::cachestore {

class CachePlan {
 public:
  // `tokens` must outlive the plan.
  CachePlan(const ClientNamespace& ns, absl::Span<const TokenId> tokens);

  const ClientNamespace& ns() const { return ns_; }
  int64_t page_size() const { return ns_.page_size; }
  // K_i of the full pages of the tokens.
  const std::vector<common::Hash128>& page_keys() const { return page_keys_; }
  // The parent of a state at p (K_{n-1}, n = floor(p / page_size); nullopt:
  // the namespace root) and its tail tokens [n * page_size, p).
  std::optional<common::Hash128> StateParent(int64_t p) const;
  absl::Span<const TokenId> StateTail(int64_t p) const;
  // S_p: the state's key, and the token-prefix hash its snapshot carries.
  common::Hash128 StateKeyAt(int64_t p) const;
  // The put of a state at p.
  ClientPut StatePut(int64_t p, StateKind kind) const;
  // The put of full page i.
  ClientPut PagePut(int64_t i) const;

 private:
  ClientNamespace ns_;
  common::Hash128 root_;
  absl::Span<const TokenId> tokens_;
  std::vector<common::Hash128> page_keys_;
};

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_CLIENT_CACHE_PLAN_H_
