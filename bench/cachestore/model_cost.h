#ifndef HYBRIDSERVE_BENCH_CACHESTORE_MODEL_COST_H_
#define HYBRIDSERVE_BENCH_CACHESTORE_MODEL_COST_H_

// What caching costs and saves for one model: the bytes of a page and of a
// state as the engine writes them (engine::StateLayout::page_bytes and
// engine::EncodedSnapshotSize), and the forward FLOPs of a prefix, which a
// hit on it skips. Value type; thread-safe.
//
// The FLOPs are engine::ModelPrefillCost's (engine/model_flops.h, which
// states the formula for every block kind): a prefix of p tokens costs
// p*C + A*p*(p+1)/2, C the per-token constant and A the attention FLOPs per
// context token.

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/state_layout.h"

namespace hybridserve::bench {

class ModelCost {
 public:
  // page_size 0: min(16, chunk_size); checkpoint_interval 0: 4 * chunk_size
  // (the engine's defaults, engine::ModelOptions). INVALID_ARGUMENT for a
  // layout the engine would refuse.
  static absl::StatusOr<ModelCost> Create(const engine::ModelConfig& config, int64_t page_size,
                                          int64_t checkpoint_interval);

  int32_t page_size() const { return layout_.page_size; }
  int64_t checkpoint_interval() const { return checkpoint_interval_; }
  int64_t vocab() const { return layout_.vocab; }
  int64_t page_bytes() const { return layout_.page_bytes(); }
  // Encoded snapshot at `position`: a grid checkpoint has no logits, an
  // exact-prefix state (prompt end, turn end) has them.
  int64_t StateBytes(int64_t position, bool with_logits) const;
  // Forward FLOPs of tokens [0, p).
  double PrefixFlops(int64_t p) const;
  double flops_per_token() const { return per_token_; }
  double attention_flops_per_context_token() const { return per_context_; }

 private:
  ModelCost(const engine::StateLayout& layout, int64_t checkpoint_interval, double per_token, double per_context)
      : layout_(layout), checkpoint_interval_(checkpoint_interval), per_token_(per_token), per_context_(per_context) {}

  engine::StateLayout layout_;
  int64_t checkpoint_interval_;
  double per_token_;    // C
  double per_context_;  // A
};

}  // namespace hybridserve::bench

#endif  // HYBRIDSERVE_BENCH_CACHESTORE_MODEL_COST_H_
