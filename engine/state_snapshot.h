#ifndef HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_
#define HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_

// The bridge between the engine's SequenceState and the snapshot codec's
// Snapshot: a grid checkpoint or turn-end state becomes bytes ready to publish
// to the cachestore, and published bytes become a state to restore.

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "engine/model_config.h"
#include "engine/sequence_state.h"
#include "engine/snapshot_codec.h"

namespace hybridserve::engine {

// The snapshot layout of a model with KV pages of `page_size` tokens.
SnapshotLayout SnapshotLayoutFor(const ModelConfig& config, int64_t page_size);

// Moves `state` into a Snapshot stamped with the model fingerprint and the
// hash of the token prefix it covers. INVALID_ARGUMENT if the state does not
// have the layout's shapes.
absl::StatusOr<Snapshot> ToSnapshot(SequenceState state, const SnapshotLayout& layout,
                                    const common::Hash128& model_fingerprint, const common::Hash128& prefix_hash);

// Moves a decoded Snapshot's arrays into a SequenceState.
SequenceState FromSnapshot(Snapshot snapshot);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_
