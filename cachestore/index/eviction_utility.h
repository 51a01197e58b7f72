#ifndef HYBRIDSERVE_CACHESTORE_INDEX_EVICTION_UTILITY_H_
#define HYBRIDSERVE_CACHESTORE_INDEX_EVICTION_UTILITY_H_

// The utility eviction policy's arithmetic (docs/ARCHITECTURE.md section 4,
// "Eviction"), shared by CacheIndex and its reference model so that both
// compute bit-identical priorities. Pure functions; thread-safe.
//
// GreedyDual-Size: each class keeps a clock (the priority of its last
// victim evicted to make room); an entry used at clock L gets the priority
// L + increment, increment = utility^(1 - recency_blend), utility = FLOPs the
// entry saves per byte it holds. The lowest priority goes first. Blend 1
// gives every entry the same increment: LRU order. Blend 0: pure GDS.

#include <cmath>
#include <cstdint>

namespace hybridserve::cachestore {

enum class EvictionPolicy { kLru, kUtility };

// The cost model of prefill: a token at position t (0-based) costs
// flops_per_token + flops_per_token_context * (t + 1) (attention over the t + 1
// keys up to itself), as engine/model_flops.h counts it. The index passes
// each entry's namespace's cost (CacheIndex::CostOf) and the cache-wide blend.
struct UtilityCost {
  double flops_per_token = 1;
  double flops_per_token_context = 0;
  double recency_blend = 0;  // in [0, 1]
};

// FLOPs of tokens [0, p).
inline double UtilityPrefixFlops(const UtilityCost& cost, int64_t p) {
  const double n = static_cast<double>(p);
  return cost.flops_per_token * n + cost.flops_per_token_context * n * (n + 1) / 2;
}

// The priority increment of an entry saving `flops` while holding `bytes`
// (its charge: bytes and index memory). An empty entry (size 0, no index
// memory) counts as 1 byte: priorities stay finite, never NaN, which the
// ordered sets need.
inline double UtilityIncrement(const UtilityCost& cost, double flops, int64_t bytes) {
  return std::pow(flops / static_cast<double>(bytes > 0 ? bytes : 1), 1 - cost.recency_blend);
}

// A state at `position` saves its whole prefix (an upper bound on what it
// saves beyond the next shallower resume point, which would need a walk up
// its chain and re-keying its neighbours whenever a state comes or goes).
inline double StateUtilityIncrement(const UtilityCost& cost, int64_t position, int64_t charge) {
  return UtilityIncrement(cost, UtilityPrefixFlops(cost, position), charge);
}

// A page is evictable only as a leaf, and evicting it drops the states
// hanging at it; the deepest of them (at `deepest_state`) is what the chain
// ending here saves, spread over the chain's bytes (depth * charge). A leaf
// page with no state yet is valued as the state to come at its end
// (depth * page_size): a publication puts its pages first and their states
// right after, and valuing such a page at nothing made it the first victim
// in that gap (bench/serving/replay_trace.py saw the states then refused
// for a missing parent). A page that never gets a state ages out by the
// clock, as under LRU.
inline double PageUtilityIncrement(const UtilityCost& cost, int64_t deepest_state, int64_t depth, int64_t charge) {
  return UtilityIncrement(cost, UtilityPrefixFlops(cost, deepest_state), depth * charge);
}

}  // namespace hybridserve::cachestore

#endif  // HYBRIDSERVE_CACHESTORE_INDEX_EVICTION_UTILITY_H_
