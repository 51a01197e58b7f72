#ifndef HYBRIDSERVE_KERNELS_CPU_GATED_DELTANET_LAYER_H_
#define HYBRIDSERVE_KERNELS_CPU_GATED_DELTANET_LAYER_H_

// A whole Gated DeltaNet layer on the CPU, as transformers 5.23's
// Qwen3NextGatedDeltaNet.forward computes it (models/qwen3_next/
// modeling_qwen3_next.py), fp32, single-threaded: the reference the engine's
// layer will be checked against. Not wired into the engine (issue 50).
//
// Per token x [hidden]:
//   qkvz = in_proj_qkvz x, ba = in_proj_ba x; both are laid out per key head
//   group g (fix_query_key_value_ordering): qkvz row = for each g:
//   [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)], ba row = for each g:
//   [b_g (r), a_g (r)], r = n_v_heads / n_k_heads; value head g*r + j owns the
//   j-th dv-slice of v_g and z_g and the j-th entry of b_g and a_g.
//   Qwen3.5 (Qwen3_5GatedDeltaNet, models/qwen3_5) projects the same values
//   with four matrices instead, already in the order used below: in_proj_qkv
//   gives the conv channels, in_proj_z gives z [n_v*dv], in_proj_b and
//   in_proj_a give b and a [n_v]; the rest of the layer is the same.
//   conv channels = [q (n_k*dk), k (n_k*dk), v (n_v*dv)] (all heads of each in
//   order); causal depthwise conv (no bias) + SiLU with the conv state.
//   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias).
//   o = gated delta rule (l2-normalised q/k, kernels/gated_delta_params.h).
//   o = rmsnorm(o per value head) * norm_weight * silu(z)   (norm before gate)
//   y = out_proj o.

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

// transformers' parameter tensors, flat row-major in their layouts. The input
// projections come in one of two forms: Qwen3-Next's (in_proj_qkvz set) or
// Qwen3.5's (in_proj_qkvz null; the four split matrices set), never both.
struct GatedDeltaNetLayerWeights {
  const float* in_proj_qkvz = nullptr;  // Qwen3-Next: [n_k_heads * (2*dk + 2*r*dv), hidden]
  const float* in_proj_ba = nullptr;    // Qwen3-Next: [n_k_heads * 2*r, hidden]
  const float* in_proj_qkv = nullptr;   // Qwen3.5: [conv channels, hidden]
  const float* in_proj_z = nullptr;     // Qwen3.5: [n_v_heads * dv, hidden]
  const float* in_proj_b = nullptr;     // Qwen3.5: [n_v_heads, hidden]
  const float* in_proj_a = nullptr;     // Qwen3.5: [n_v_heads, hidden]
  const float* conv1d = nullptr;        // [conv channels, d_conv] (conv1d.weight [C, 1, d_conv])
  const float* dt_bias = nullptr;       // [n_v_heads]
  const float* a_log = nullptr;         // [n_v_heads]
  const float* norm = nullptr;          // [dv]
  const float* out_proj = nullptr;      // [hidden, n_v_heads * dv]
};

struct GatedDeltaNetLayerShape {
  int64_t hidden = 0;
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t dk = 0;
  int64_t dv = 0;
  int64_t d_conv = 4;
  float eps = 1e-6f;        // the gated norm's
  int64_t chunk_size = 64;  // the chunked rule's grid (a power of two)
  // Prefill with the sequential oracle instead of the chunked rule: then a
  // decode step gives the bits of the prefill row for that token.
  bool sequential = false;
};

// 2*n_k_heads*dk + n_v_heads*dv: the conv channels; the conv state is
// [GatedDeltaNetConvChannels, d_conv - 1] and the recurrent state
// [n_v_heads, dk, dv].
inline int64_t GatedDeltaNetConvChannels(const GatedDeltaNetLayerShape& s) {
  return 2 * s.n_k_heads * s.dk + s.n_v_heads * s.dv;
}

// The checks of both entry points: kKernelInvalidArgument naming the first bad
// field (a shape field, a null weight by its field name, or "x", "y",
// "conv_state", "recurrent_state", "seqlen", "start_pos").
KernelStatus CheckGatedDeltaNetLayerShape(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                          const char** bad_field = nullptr);

// Optional outputs of a prefill at the absolute chunk boundaries b (multiples
// of chunk_size) with start_pos < b <= start_pos + seqlen, i.e.
// GatedDeltaNumChunkStates(start_pos, seqlen, chunk_size) rows, row i at
// b = (start_pos / chunk_size + 1 + i) * chunk_size: the states a prefill
// ending at b would return, bit for bit (grid checkpoints: exact restore points).
struct GatedDeltaNetLayerCheckpoints {
  float* recurrent = nullptr;  // [rows, n_v_heads, dk, dv]; null: not written
  float* conv = nullptr;       // [rows, conv channels, d_conv - 1]; null: not written
};

// Prefill: seqlen tokens x [seqlen, hidden] of one sequence at absolute
// positions [start_pos, start_pos + seqlen) (the chunk grid is absolute).
// conv_state and recurrent_state hold the states at start_pos on entry (zeros
// at a sequence's start) and at start_pos + seqlen on return. y [seqlen,
// hidden] must not alias x. A prefill continued from the states of an earlier
// one equals the unsplit prefill: bit for bit when the split sits on the chunk
// grid (or the rule is sequential), else within the chunked rule's rounding.
KernelStatus GatedDeltaNetLayerPrefill(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                       const float* x, int64_t seqlen, int64_t start_pos, float* conv_state,
                                       float* recurrent_state, float* y,
                                       const GatedDeltaNetLayerCheckpoints& checkpoints = {},
                                       const char** bad_field = nullptr);

// One decode token x [hidden] -> y [hidden], states updated in place. Bit for
// bit the row a sequential prefill gives for that token with the same states.
KernelStatus GatedDeltaNetLayerDecode(const GatedDeltaNetLayerShape& s, const GatedDeltaNetLayerWeights& w,
                                      const float* x, float* conv_state, float* recurrent_state, float* y,
                                      const char** bad_field = nullptr);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_GATED_DELTANET_LAYER_H_
