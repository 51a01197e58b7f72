#include "engine/state_snapshot.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hybridserve::engine {

SnapshotLayout SnapshotLayoutFor(const ModelConfig& config, int64_t page_size) {
  SnapshotLayout l;
  const bool mamba = config.CountLayers(LayerKind::kMamba2) > 0;
  const bool attention = config.CountLayers(LayerKind::kAttention) > 0;
  l.mamba_layers = static_cast<int32_t>(config.CountLayers(LayerKind::kMamba2));
  l.ssm_heads = mamba ? static_cast<int32_t>(config.mamba.num_heads) : 0;
  l.ssm_head_dim = mamba ? static_cast<int32_t>(config.mamba.head_dim) : 0;
  l.ssm_state = mamba ? static_cast<int32_t>(config.mamba.state_size) : 0;
  l.conv_dim = mamba ? static_cast<int32_t>(config.mamba.conv_dim()) : 0;
  l.conv_kernel = mamba ? static_cast<int32_t>(config.mamba.conv_kernel) : 0;
  l.attention_layers = static_cast<int32_t>(config.CountLayers(LayerKind::kAttention));
  l.kv_heads = attention ? static_cast<int32_t>(config.attention.num_kv_heads) : 0;
  l.kv_head_dim = attention ? static_cast<int32_t>(config.attention.head_dim) : 0;
  l.page_size = static_cast<int32_t>(page_size);
  l.vocab = static_cast<int32_t>(config.vocab_size);
  return l;
}

absl::StatusOr<Snapshot> ToSnapshot(SequenceState state, const SnapshotLayout& layout,
                                    const common::Hash128& model_fingerprint, const common::Hash128& prefix_hash) {
  auto check = [](const std::vector<std::vector<float>>& v, int64_t count, int64_t floats,
                  const char* what) -> absl::Status {
    if (static_cast<int64_t>(v.size()) != count) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", v.size(), " layers, layout says ", count));
    }
    for (const auto& a : v) {
      if (static_cast<int64_t>(a.size()) != floats) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", a.size(), " floats, layout says ", floats));
      }
    }
    return absl::OkStatus();
  };
  if (state.position < 0) return absl::InvalidArgumentError("negative position");
  const int64_t tail = layout.page_size > 0 ? state.position % layout.page_size : 0;
  const int64_t kv = tail * layout.kv_heads * layout.kv_head_dim;
  absl::Status s = check(state.ssm_states, layout.mamba_layers,
                         int64_t{layout.ssm_heads} * layout.ssm_head_dim * layout.ssm_state, "ssm states");
  if (s.ok()) {
    s = check(state.conv_states, layout.mamba_layers, int64_t{layout.conv_dim} * (layout.conv_kernel - 1),
              "conv states");
  }
  if (s.ok()) s = check(state.tail_k, layout.attention_layers, kv, "tail K");
  if (s.ok()) s = check(state.tail_v, layout.attention_layers, kv, "tail V");
  if (s.ok() && !state.last_logits.empty() && static_cast<int64_t>(state.last_logits.size()) != layout.vocab) {
    s = absl::InvalidArgumentError(absl::StrCat("last logits: ", state.last_logits.size(), " != vocab ", layout.vocab));
  }
  if (!s.ok()) return s;
  Snapshot out;
  out.model_fingerprint = model_fingerprint;
  out.position = state.position;
  out.prefix_hash = prefix_hash;
  out.layout = layout;
  out.ssm_states = std::move(state.ssm_states);
  out.conv_states = std::move(state.conv_states);
  out.tail_k = std::move(state.tail_k);
  out.tail_v = std::move(state.tail_v);
  out.last_logits = std::move(state.last_logits);
  return out;
}

SequenceState FromSnapshot(Snapshot snapshot) {
  SequenceState s;
  s.position = snapshot.position;
  s.ssm_states = std::move(snapshot.ssm_states);
  s.conv_states = std::move(snapshot.conv_states);
  s.tail_k = std::move(snapshot.tail_k);
  s.tail_v = std::move(snapshot.tail_v);
  s.last_logits = std::move(snapshot.last_logits);
  return s;
}

}  // namespace hybridserve::engine
