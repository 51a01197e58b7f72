#ifndef HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_
#define HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_

// The bridge between the engine's SequenceState and the snapshot codec's
// Snapshot: a grid checkpoint or turn-end state becomes bytes ready to publish
// to the cachestore, and published bytes become a state to restore. (A
// decoded snapshot restores without any copy through
// SequenceTable::RestoreFromView; these are for callers that hold vectors.)

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "engine/sequence_state.h"
#include "engine/snapshot_codec.h"
#include "engine/state_layout.h"

namespace hybridserve::engine {

// Moves `state` into a Snapshot stamped with the model fingerprint and the
// hash of the token prefix it covers. INVALID_ARGUMENT (naming the array) if
// the state does not have the layout's shapes.
absl::StatusOr<Snapshot> ToSnapshot(SequenceState state, const StateLayout& layout,
                                    const common::Hash128& model_fingerprint, const common::Hash128& prefix_hash);

// Moves a decoded Snapshot's arrays into a SequenceState.
SequenceState FromSnapshot(Snapshot snapshot);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_STATE_SNAPSHOT_H_
