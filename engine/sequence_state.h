#ifndef HYBRIDSERVE_ENGINE_SEQUENCE_STATE_H_
#define HYBRIDSERVE_ENGINE_SEQUENCE_STATE_H_

// The state of one sequence after its first `position` tokens, apart from its
// full KV pages (docs/ARCHITECTURE.md sections 3 and 4): what a grid checkpoint or an
// exact-prefix snapshot holds. The per-layer vectors have the names, order and
// shapes of engine/snapshot_codec.h's Snapshot, so converting is a move of each
// field (the codec adds the fingerprint, prefix hash and layout).
//
// The full pages [0, floor(position / page_size)) travel separately, as page
// bytes (see SequenceTable::ExportPage for their layout).

#include <cstdint>
#include <vector>

namespace hybridserve::engine {

// Value type.
struct SequenceState {
  int64_t position = 0;  // tokens processed
  // Per Mamba2 layer, in model order: [n_heads, head_dim, d_state].
  std::vector<std::vector<float>> ssm_states;
  // Per Mamba2 layer: [conv_dim, d_conv - 1], the last d_conv - 1 conv inputs
  // before `position` (oldest first; zeros before token 0).
  std::vector<std::vector<float>> conv_states;
  // Per attention layer, in model order: K and V of the tokens of the partial
  // last page, positions [position - position % page_size, position):
  // [position % page_size, n_kv_heads, head_dim] each (empty on a page boundary).
  std::vector<std::vector<float>> tail_k;
  std::vector<std::vector<float>> tail_v;
  // [vocab]: logits of the token at position - 1, or empty when not kept.
  std::vector<float> last_logits;
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_SEQUENCE_STATE_H_
