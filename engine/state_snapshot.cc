#include "engine/state_snapshot.h"

#include <utility>

#include "common/status_macros.h"

namespace hybridserve::engine {

absl::StatusOr<Snapshot> ToSnapshot(SequenceState state, const StateLayout& layout,
                                    const common::Hash128& model_fingerprint, const common::Hash128& prefix_hash) {
  RETURN_IF_ERROR(layout.CheckState(state));
  Snapshot out;
  static_cast<SequenceState&>(out) = std::move(state);
  out.model_fingerprint = model_fingerprint;
  out.prefix_hash = prefix_hash;
  out.layout = layout;
  return out;
}

SequenceState FromSnapshot(Snapshot snapshot) { return std::move(static_cast<SequenceState&>(snapshot)); }

}  // namespace hybridserve::engine
