#ifndef HYBRIDSERVE_KERNELS_CPU_GATED_ATTENTION_LAYER_H_
#define HYBRIDSERVE_KERNELS_CPU_GATED_ATTENTION_LAYER_H_

// A whole gated attention layer on the CPU, as transformers 5.23's
// Qwen3NextAttention.forward computes it (models/qwen3_next/
// modeling_qwen3_next.py), fp32 with the attention itself in double (the
// naive oracle of attention_reference.h): the reference the engine's layer
// will be checked against. Not wired into the engine (issue 50).
//
// Per token x [hidden]:
//   q_proj x = per head [q_h (head_dim), gate_h (head_dim)] (interleaved by head)
//   q_h = rmsnorm(q_h) * (1 + q_norm)     zero-centred RMSNorm (Qwen3NextRMSNorm)
//   k_h = rmsnorm(k_proj x head) * (1 + k_norm); v = v_proj x
//   RoPE, rotate-half, on the first rotary_dim dims of q and k (partial RoPE;
//   the rest pass through)
//   o = causal softmax attention (scale 1/sqrt(head_dim); query head h reads
//   key/value head h / (n_heads / n_kv_heads))
//   o = o * sigmoid(gate); y = o_proj o.
// The zero-centred norm is kernels/cpu/norm's RmsNorm given the weight 1 + w
// (rounded to fp32, as transformers computes it), no kernel of its own.

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

// transformers' parameter tensors (no biases: attention_bias false), flat row-major.
struct GatedAttentionLayerWeights {
  const float* q_proj = nullptr;  // [n_heads * 2 * head_dim, hidden]
  const float* k_proj = nullptr;  // [n_kv_heads * head_dim, hidden]
  const float* v_proj = nullptr;  // [n_kv_heads * head_dim, hidden]
  const float* o_proj = nullptr;  // [hidden, n_heads * head_dim]
  const float* q_norm = nullptr;  // [head_dim], zero-centred (scale 1 + w)
  const float* k_norm = nullptr;  // [head_dim], zero-centred
};

struct GatedAttentionLayerShape {
  int64_t hidden = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // partial_rotary_factor * head_dim; even; 0: head_dim
  double theta = 10000.0;
  float eps = 1e-6f;
};

// kKernelInvalidArgument naming the first bad shape field or null weight.
KernelStatus CheckGatedAttentionLayerShape(const GatedAttentionLayerShape& s, const GatedAttentionLayerWeights& w,
                                           const char** bad_field = nullptr);

// n tokens x [n, hidden] of one sequence at positions [start_pos, start_pos + n).
// k_cache, v_cache [start_pos + n (at least), n_kv_heads, head_dim]: rows
// before start_pos hold the earlier tokens' keys (normed and rotated) and
// values as this function wrote them; rows [start_pos, start_pos + n) are
// written. y [n, hidden]. A row's bits depend only on its token and the ones
// before it: a split forward, or a decode step (n = 1), gives the unsplit
// forward's bits.
KernelStatus GatedAttentionLayerForward(const GatedAttentionLayerShape& s, const GatedAttentionLayerWeights& w,
                                        const float* x, int64_t n, int64_t start_pos, float* k_cache, float* v_cache,
                                        float* y, const char** bad_field = nullptr);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_GATED_ATTENTION_LAYER_H_
