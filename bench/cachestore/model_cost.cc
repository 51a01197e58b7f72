#include "bench/cachestore/model_cost.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model_flops.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::bench {

absl::StatusOr<ModelCost> ModelCost::Create(const engine::ModelConfig& config, int64_t page_size,
                                            int64_t checkpoint_interval) {
  const int64_t chunk = config.chunk_size() > 0 ? config.chunk_size() : 16;
  if (page_size == 0) page_size = std::min<int64_t>(16, chunk);
  if (checkpoint_interval == 0) checkpoint_interval = 4 * chunk;
  if (checkpoint_interval <= 0 || checkpoint_interval % page_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint interval ", checkpoint_interval,
                                                   " must be a positive multiple of the page size ", page_size));
  }
  const engine::StateLayout layout = engine::StateLayout::ForModel(config, page_size);
  RETURN_IF_ERROR(layout.Validate());

  const PrefillCost cost = engine::ModelPrefillCost(config);
  return ModelCost(layout, checkpoint_interval, cost.flops_per_token, cost.flops_per_token_context);
}

int64_t ModelCost::StateBytes(int64_t position, bool with_logits) const {
  absl::StatusOr<size_t> size = engine::EncodedSnapshotSize(layout_, position, with_logits);
  return size.ok() ? static_cast<int64_t>(*size) : 0;
}

double ModelCost::PrefixFlops(int64_t p) const {
  const double n = static_cast<double>(p);
  return n * per_token_ + per_context_ * n * (n + 1) / 2;
}

}  // namespace hybridserve::bench
