#ifndef HYBRIDSERVE_ENGINE_STATE_LAYOUT_H_
#define HYBRIDSERVE_ENGINE_STATE_LAYOUT_H_

// The one description of the state of a sequence of one model: the shapes of
// every array a sequence owns (per Mamba2 layer the SSM and conv states, per
// attention layer the K and V of its KV pages), computed once from the config
// and the page size. The pools, the size checks, SequenceState, the snapshot
// codec (whose header carries these fields) and the page wire format
// (engine/page_format.h) all use it; nothing else computes a state size.
//
// Every array is fp32, little-endian, row-major:
//   ssm state,  per Mamba2 layer     [ssm_heads, ssm_head_dim, ssm_state]
//               per Gated DeltaNet layer [v_heads, k_head_dim, v_head_dim]
//   conv state, per recurrent layer  [conv_dim, conv_kernel - 1]
// A model's recurrent layers are all Mamba2-like or all Gated DeltaNet, so the
// ssm fields describe whichever it has ("mamba_layers" counts either); the
// model fingerprint, not the layout, tells the two apart.
//   K or V of one page, per attention layer  [page_size, kv_heads, kv_head_dim]
//
// Value type; all functions are thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "engine/model_config.h"
#include "engine/sequence_state.h"

namespace hybridserve::engine {

// Bound on mamba_layers and attention_layers: far above any real model, low
// enough that a forged snapshot header cannot make a decoder allocate much for
// empty per-layer arrays.
inline constexpr int32_t kStateMaxLayers = 16384;
// Bound on the floats of any one array (4 TiB): keeps every size computation
// of a valid layout far from overflow.
inline constexpr int64_t kStateMaxArrayFloats = int64_t{1} << 40;

// Host views of the arrays of a SequenceState (or of the same arrays anywhere
// else in host memory: a state pool the host can address). Shapes as in
// SequenceState. Valid while what it views lives.
struct StateArrays {
  int64_t position = 0;
  std::vector<absl::Span<const float>> ssm_states;   // per Mamba2 layer
  std::vector<absl::Span<const float>> conv_states;  // per Mamba2 layer
  std::vector<absl::Span<const float>> tail_k;       // per attention layer
  std::vector<absl::Span<const float>> tail_v;       // per attention layer
  absl::Span<const float> last_logits;               // [vocab] or empty

  static StateArrays Of(const SequenceState& state);
};

struct StateLayout {
  // The wire fields, in the order the snapshot header stores them
  // (kStateLayoutFields). Zero for a layer kind the model does not have.
  int32_t mamba_layers = 0;
  int32_t ssm_heads = 0;     // Mamba2 n_heads
  int32_t ssm_head_dim = 0;  // Mamba2 head_dim
  int32_t ssm_state = 0;     // Mamba2 d_state
  int32_t conv_dim = 0;      // channels of the causal conv
  int32_t conv_kernel = 0;   // d_conv; the conv state keeps d_conv - 1 columns
  int32_t attention_layers = 0;
  int32_t kv_heads = 0;
  int32_t kv_head_dim = 0;
  int32_t page_size = 0;  // tokens per KV page, >= 1
  int32_t vocab = 0;      // the model's vocabulary (the size of last logits)

  // The layout of `config` with pages of `page_size` tokens.
  static StateLayout ForModel(const ModelConfig& config, int64_t page_size);

  // Floats of one array of each kind, for a layout that passes Validate()
  // (which bounds them) and a position >= 0.
  int64_t ssm_state_floats() const;                // ssm_heads * ssm_head_dim * ssm_state
  int64_t conv_state_floats() const;               // conv_dim * (conv_kernel - 1)
  int64_t kv_token_floats() const;                 // kv_heads * kv_head_dim: one token's K (or V) in one layer
  int64_t page_kv_floats() const;                  // page_size * kv_token_floats(): one page's K (or V), one layer
  int64_t tail_tokens(int64_t position) const;     // position mod page_size
  int64_t tail_kv_floats(int64_t position) const;  // tail_tokens(position) * kv_token_floats()
  // Bytes of one page on the wire and in the pools: every attention layer's K
  // and V (0 without attention layers).
  int64_t page_bytes() const;
  // Full pages of a sequence of `positions` tokens (positions / page_size),
  // whose bytes travel as pages (page_bytes() each: none without attention
  // layers).
  int64_t full_pages(int64_t positions) const;
  // Physical KV pages that hold `positions` tokens (the partial last one
  // included); 0 without attention layers, which need no pages.
  int64_t pages_for(int64_t positions) const;
  // Bytes of a sequence's SSM and conv states (all Mamba2 layers).
  int64_t recurrent_state_bytes() const;

  // OK, or INVALID_ARGUMENT naming the first field out of range: layer counts
  // in [0, kStateMaxLayers], page_size >= 1, the shapes of every layer kind
  // present >= 1 (conv_kernel >= 1), everything else >= 0, and no array (a
  // full page of K or V included) above kStateMaxArrayFloats.
  absl::Status Validate() const;

  // OK when `state` has this layout's shapes at its position: one array per
  // layer of each kind, each of the right size, last logits empty or [vocab].
  // Otherwise INVALID_ARGUMENT naming the array ("ssm_states[1] has 39 floats,
  // the layout and position need 40").
  absl::Status CheckState(const StateArrays& state) const;
  absl::Status CheckState(const SequenceState& state) const { return CheckState(StateArrays::Of(state)); }

  // XXH3-128 of the wire fields and the format version: equal layouts, equal
  // fingerprints. Carried where only a fingerprint fits (a transfer ticket).
  common::Hash128 Fingerprint() const;

  // "{mamba_layers=4 ssm_heads=8 ...}".
  std::string ToString() const;
  // The fields of `actual` that differ from `expected`, as
  // "page_size 32 (expected 16), kv_heads 4 (expected 2)"; empty when equal.
  static std::string Mismatch(const StateLayout& expected, const StateLayout& actual);

  friend bool operator==(const StateLayout& a, const StateLayout& b);
  friend bool operator!=(const StateLayout& a, const StateLayout& b) { return !(a == b); }
};

// The wire fields in order, and their names (for messages).
inline constexpr int kStateLayoutFieldCount = 11;
inline constexpr int32_t StateLayout::*kStateLayoutFields[kStateLayoutFieldCount] = {
    &StateLayout::mamba_layers,     &StateLayout::ssm_heads, &StateLayout::ssm_head_dim,
    &StateLayout::ssm_state,        &StateLayout::conv_dim,  &StateLayout::conv_kernel,
    &StateLayout::attention_layers, &StateLayout::kv_heads,  &StateLayout::kv_head_dim,
    &StateLayout::page_size,        &StateLayout::vocab,
};
inline constexpr const char* kStateLayoutFieldNames[kStateLayoutFieldCount] = {
    "mamba_layers",     "ssm_heads", "ssm_head_dim", "ssm_state", "conv_dim", "conv_kernel",
    "attention_layers", "kv_heads",  "kv_head_dim",  "page_size", "vocab",
};

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_STATE_LAYOUT_H_
