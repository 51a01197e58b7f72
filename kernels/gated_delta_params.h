#ifndef HYBRIDSERVE_KERNELS_GATED_DELTA_PARAMS_H_
#define HYBRIDSERVE_KERNELS_GATED_DELTA_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// Gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5), as transformers 5.23
// writes it in models/qwen3_next/modeling_qwen3_next.py
// (torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule). Per value
// head h, reading key head kh = h / (n_v_heads / n_k_heads) (transformers'
// repeat_interleave: each key head serves that many consecutive value heads),
// with state S of shape [dk, dv], per token t:
//   if l2norm_qk: q_t = q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise
//   q_t = q_t / sqrt(dk)
//   S = S * exp(g_t)                          g_t <= 0: log-space decay
//   kv_mem = S^T k_t                          [dv]
//   delta = (v_t - kv_mem) * beta_t
//   S = S + k_t (outer) delta
//   o_t = S^T q_t                             [dv]
// All tensors fp32; heads are contiguous within a token. q, k and v may have a
// token (prefill) or batch (decode) stride of their own, because the engine's
// are slices of one conv output row [q (n_k*dk) | k (n_k*dk) | v (n_v*dv)];
// g, beta and o are packed.
// l2norm_qk is transformers' use_qk_l2norm_in_kernel; Qwen3-Next and Qwen3.5
// call the rule with it set, so it defaults to true (the kernel normalises).

// Number of absolute chunk boundaries b (multiples of chunk_size) with
// start_pos < b <= start_pos + seqlen: the rows of GatedDeltaParams::chunk_states.
inline int64_t GatedDeltaNumChunkStates(int64_t start_pos, int64_t seqlen, int64_t chunk_size) {
  if (chunk_size <= 0 || seqlen <= 0 || start_pos < 0) return 0;
  return (start_pos + seqlen) / chunk_size - start_pos / chunk_size;
}

// The chunked rule runs in blocks of GatedDeltaBlockSize(chunk_size) tokens on
// the absolute grid (transformers' chunk of 64 tokens, or the whole chunk when
// chunk_size is smaller): a larger chunk_size only spaces the chunk_states
// rows, it does not grow the per-block UT system.
inline constexpr int64_t kGatedDeltaMaxBlock = 64;
inline int64_t GatedDeltaBlockSize(int64_t chunk_size) {
  return chunk_size < kGatedDeltaMaxBlock ? chunk_size : kGatedDeltaMaxBlock;
}

// Prefill over tokens at absolute positions [start_pos, start_pos + seqlen) of
// one sequence. Chunks sit on the absolute grid (multiples of chunk_size from
// position 0); when start_pos is not a multiple the first chunk is partial.
// Contract (as the SSD scan's): the bits of o and of every state depend only on
// the inputs and the state at the start of that position's chunk (indeed of
// its block), never on where the call started (when it started on the grid) or
// how many chunks the call holds. The sequential oracle ignores chunk_size
// except for chunk_states.
struct GatedDeltaParams {
  const float* q = nullptr;              // [seqlen, n_k_heads, dk]
  const float* k = nullptr;              // [seqlen, n_k_heads, dk]
  const float* v = nullptr;              // [seqlen, n_v_heads, dv]
  const float* g = nullptr;              // [seqlen, n_v_heads], log decay (<= 0)
  const float* beta = nullptr;           // [seqlen, n_v_heads], write strength (after sigmoid)
  const float* initial_state = nullptr;  // [n_v_heads, dk, dv], state at start_pos; null: zeros
  float* o = nullptr;                    // [seqlen, n_v_heads, dv] packed; must not alias inputs
  // [n_v_heads, dk, dv], state at start_pos + seqlen; null: not written; may alias initial_state.
  float* final_state = nullptr;
  // [GatedDeltaNumChunkStates(start_pos, seqlen, chunk_size), n_v_heads, dk, dv]:
  // row i is the state at absolute position (start_pos / chunk_size + 1 + i) * chunk_size. May be null.
  float* chunk_states = nullptr;

  int64_t seqlen = 0;
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t dk = 0;
  int64_t dv = 0;
  int64_t chunk_size = 64;  // a power of two
  int64_t start_pos = 0;    // absolute position of token 0
  bool l2norm_qk = true;
  // Elements between consecutive tokens of q, k, v; 0: packed (n_k_heads * dk,
  // n_k_heads * dk, n_v_heads * dv). Non-zero strides must be at least that.
  int64_t q_token_stride = 0;
  int64_t k_token_stride = 0;
  int64_t v_token_stride = 0;
};

namespace gated_delta_internal {

// The head and size fields both steps share: the name of the first bad one,
// else null.
inline const char* BadShape(int64_t n_k_heads, int64_t n_v_heads, int64_t dk, int64_t dv) {
  if (n_k_heads <= 0) return "n_k_heads";
  if (n_v_heads <= 0 || n_v_heads % n_k_heads != 0) return "n_v_heads";
  if (dk <= 0) return "dk";
  if (dv <= 0) return "dv";
  return nullptr;
}

// The first null of the tensors both steps read and write, by name; else null.
template <typename Params>
const char* NullTensor(const Params& p) {
  if (p.q == nullptr) return "q";
  if (p.k == nullptr) return "k";
  if (p.v == nullptr) return "v";
  if (p.g == nullptr) return "g";
  if (p.beta == nullptr) return "beta";
  if (p.o == nullptr) return "o";
  return nullptr;
}

// The first stride (q, k, v order) that is negative or non-zero and shorter
// than its packed row; else null.
inline const char* BadStride(int64_t q, int64_t k, int64_t v, int64_t n_k_heads, int64_t n_v_heads, int64_t dk,
                             int64_t dv, const char* q_name, const char* k_name, const char* v_name) {
  if (q < 0 || (q != 0 && q < n_k_heads * dk)) return q_name;
  if (k < 0 || (k != 0 && k < n_k_heads * dk)) return k_name;
  if (v < 0 || (v != 0 && v < n_v_heads * dv)) return v_name;
  return nullptr;
}

inline KernelStatus Verdict(const char* bad, const char** bad_field) {
  if (bad == nullptr) return kKernelOk;
  if (bad_field != nullptr) *bad_field = bad;
  return kKernelInvalidArgument;
}

}  // namespace gated_delta_internal

// The checks every backend makes before the prefill runs. Returns
// kKernelInvalidArgument and, when bad_field is not null, sets *bad_field to the
// name of the first offending field; kKernelOk leaves *bad_field untouched.
inline KernelStatus CheckGatedDeltaParams(const GatedDeltaParams& p, const char** bad_field = nullptr) {
  auto first_bad = [&p]() -> const char* {
    if (p.seqlen < 0) return "seqlen";
    if (const char* bad = gated_delta_internal::BadShape(p.n_k_heads, p.n_v_heads, p.dk, p.dv)) return bad;
    if (p.chunk_size <= 0 || (p.chunk_size & (p.chunk_size - 1)) != 0) return "chunk_size";
    if (p.start_pos < 0) return "start_pos";
    if (const char* bad = gated_delta_internal::BadStride(p.q_token_stride, p.k_token_stride, p.v_token_stride,
                                                          p.n_k_heads, p.n_v_heads, p.dk, p.dv, "q_token_stride",
                                                          "k_token_stride", "v_token_stride")) {
      return bad;
    }
    return p.seqlen > 0 ? gated_delta_internal::NullTensor(p) : nullptr;
  };
  return gated_delta_internal::Verdict(first_bad(), bad_field);
}

// One decode step for a batch of sequences, one token each. Same arithmetic,
// in the same order, as one step of the CPU sequential oracle (bit-identical).
struct GatedDeltaDecodeParams {
  // Pool of states [num_slots, n_v_heads, dk, dv], read and updated in place.
  float* state = nullptr;
  // [batch]: slot of sequence b in `state`; null: slot b. A negative slot marks a
  // padding row: nothing is read or written for it (o row left untouched).
  const int32_t* state_slots = nullptr;
  const float* q = nullptr;     // [batch, n_k_heads, dk], row stride q_batch_stride
  const float* k = nullptr;     // [batch, n_k_heads, dk], row stride k_batch_stride
  const float* v = nullptr;     // [batch, n_v_heads, dv], row stride v_batch_stride
  const float* g = nullptr;     // [batch, n_v_heads]
  const float* beta = nullptr;  // [batch, n_v_heads]
  float* o = nullptr;           // [batch, n_v_heads, dv] packed

  int64_t batch = 0;
  int64_t num_slots = 0;
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;
  int64_t dk = 0;
  int64_t dv = 0;
  bool l2norm_qk = true;
  // Elements between consecutive rows of q, k, v; 0: packed (as the prefill's
  // token strides).
  int64_t q_batch_stride = 0;
  int64_t k_batch_stride = 0;
  int64_t v_batch_stride = 0;
};

// As CheckGatedDeltaParams, for the decode step. state_slots entries are
// checked by each backend (kernels/cpu rejects the call naming "state_slots").
inline KernelStatus CheckGatedDeltaDecodeParams(const GatedDeltaDecodeParams& p, const char** bad_field = nullptr) {
  auto first_bad = [&p]() -> const char* {
    if (p.batch < 0) return "batch";
    if (p.num_slots <= 0) return "num_slots";
    if (const char* bad = gated_delta_internal::BadShape(p.n_k_heads, p.n_v_heads, p.dk, p.dv)) return bad;
    if (const char* bad = gated_delta_internal::BadStride(p.q_batch_stride, p.k_batch_stride, p.v_batch_stride,
                                                          p.n_k_heads, p.n_v_heads, p.dk, p.dv, "q_batch_stride",
                                                          "k_batch_stride", "v_batch_stride")) {
      return bad;
    }
    if (p.state == nullptr) return "state";
    return gated_delta_internal::NullTensor(p);
  };
  return gated_delta_internal::Verdict(first_bad(), bad_field);
}

// The gates of the rule from the layer's projections, as transformers 5.23's
// Qwen3NextGatedDeltaNet computes them in fp32:
//   beta[t, h] = sigmoid(b[t, h])   = 1 / (1 + exp(-b))
//   g[t, h]    = -exp(a_log[h]) * softplus(a[t, h] + dt_bias[h])
// softplus as torch's F.softplus (beta 1, threshold 20): x > 20 ? x : log1p(exp(x)).
struct GatedDeltaGatesParams {
  const float* a = nullptr;        // [n_tokens, n_heads], row stride a_row_stride
  const float* b = nullptr;        // [n_tokens, n_heads], row stride b_row_stride
  const float* dt_bias = nullptr;  // [n_heads]
  const float* a_log = nullptr;    // [n_heads]
  float* g = nullptr;              // [n_tokens, n_heads] packed; must not alias a or b
  float* beta = nullptr;           // [n_tokens, n_heads] packed; must not alias a or b
  int64_t n_tokens = 0;
  int64_t n_heads = 0;       // value heads
  int64_t a_row_stride = 0;  // 0: n_heads; else >= n_heads
  int64_t b_row_stride = 0;  // 0: n_heads; else >= n_heads
};

// As CheckGatedDeltaParams, for the gates.
inline KernelStatus CheckGatedDeltaGatesParams(const GatedDeltaGatesParams& p, const char** bad_field = nullptr) {
  auto first_bad = [&p]() -> const char* {
    if (p.n_tokens < 0) return "n_tokens";
    if (p.n_heads <= 0) return "n_heads";
    if (p.a_row_stride < 0 || (p.a_row_stride != 0 && p.a_row_stride < p.n_heads)) return "a_row_stride";
    if (p.b_row_stride < 0 || (p.b_row_stride != 0 && p.b_row_stride < p.n_heads)) return "b_row_stride";
    if (p.dt_bias == nullptr) return "dt_bias";
    if (p.a_log == nullptr) return "a_log";
    if (p.n_tokens == 0) return nullptr;
    if (p.a == nullptr) return "a";
    if (p.b == nullptr) return "b";
    if (p.g == nullptr) return "g";
    if (p.beta == nullptr) return "beta";
    return nullptr;
  };
  return gated_delta_internal::Verdict(first_bad(), bad_field);
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_GATED_DELTA_PARAMS_H_
