#include "bench/cachestore/model_cost.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::bench {

absl::StatusOr<ModelCost> ModelCost::Create(const engine::ModelConfig& config, int64_t page_size,
                                            int64_t checkpoint_interval) {
  const int64_t chunk = config.mamba.chunk_size > 0 ? config.mamba.chunk_size : 16;
  if (page_size == 0) page_size = std::min<int64_t>(16, chunk);
  if (checkpoint_interval == 0) checkpoint_interval = 4 * chunk;
  if (checkpoint_interval <= 0 || checkpoint_interval % page_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint interval ", checkpoint_interval,
                                                   " must be a positive multiple of the page size ", page_size));
  }
  const engine::StateLayout layout = engine::StateLayout::ForModel(config, page_size);
  RETURN_IF_ERROR(layout.Validate());

  const double h = static_cast<double>(config.hidden_size);
  const engine::Mamba2Params& m = config.mamba;
  const double d_inner = static_cast<double>(m.num_heads * m.head_dim);
  const double bc = 2.0 * static_cast<double>(m.n_groups * m.state_size);
  const double mamba = 2 * h * (2 * d_inner + bc + static_cast<double>(m.num_heads)) +
                       2 * (d_inner + bc) * static_cast<double>(m.conv_kernel) +
                       4 * d_inner * static_cast<double>(m.state_size) + 2 * d_inner * h;
  const double q = static_cast<double>(config.attention.q_dim());
  const double kv = static_cast<double>(config.attention.kv_dim());
  const double attention = 2 * h * (q + 2 * kv) + 2 * q * h;
  const double mlp = 4 * h * static_cast<double>(config.mlp.intermediate_size);
  const double n_mamba = static_cast<double>(config.CountLayers(engine::LayerKind::kMamba2));
  const double n_attention = static_cast<double>(config.CountLayers(engine::LayerKind::kAttention));
  const double n_mlp = static_cast<double>(config.CountLayers(engine::LayerKind::kMlp));
  return ModelCost(layout, checkpoint_interval, n_mamba * mamba + n_attention * attention + n_mlp * mlp,
                   4 * q * n_attention);
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
