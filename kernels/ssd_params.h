#ifndef HYBRIDSERVE_KERNELS_SSD_PARAMS_H_
#define HYBRIDSERVE_KERNELS_SSD_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// Mamba2 state-space recurrence, per head h (head h reads group
// g = h / (n_heads / n_groups) of B and C):
//   dA_t = exp(dt_t[h] * A[h])
//   s_t  = dA_t * s_{t-1} + dt_t[h] * x_t[h] (outer) B_t[g]     s is [head_dim, d_state]
//   y_t[h] = s_t . C_t[g] + D[h] * x_t[h]
// All tensors are fp32. Within one token, heads (and groups) are contiguous:
// element (t, h, p) of x lives at x[t * x_token_stride + h * head_dim + p].
// A token stride of 0 means "packed" (the product of the inner dimensions), so
// x, B and C can point into the conv output [seqlen, conv_dim] with stride conv_dim.

// Number of absolute chunk boundaries b (multiples of chunk_size) with
// start_pos < b <= start_pos + seqlen: the rows of SsdChunkScanParams::chunk_states.
inline int64_t SsdNumChunkStates(int64_t start_pos, int64_t seqlen, int64_t chunk_size) {
  if (chunk_size <= 0 || seqlen <= 0 || start_pos < 0) return 0;
  return (start_pos + seqlen) / chunk_size - start_pos / chunk_size;
}

// Prefill over tokens at absolute positions [start_pos, start_pos + seqlen) of
// one sequence. Chunks sit on the absolute grid (multiples of chunk_size from
// position 0), so when start_pos is not a multiple of chunk_size the first chunk
// is partial. Contract (docs/ARCHITECTURE.md section 3): the bits of y and of every state
// for a position depend only on the inputs and the state at the start of that
// position's chunk, never on where the call started (when it started on the
// grid), how many chunks the call holds, or the thread count.
struct SsdChunkScanParams {
  const float* x = nullptr;   // [seqlen, n_heads, head_dim], token stride x_token_stride
  const float* dt = nullptr;  // [seqlen, n_heads], token stride dt_token_stride; after bias and softplus (and clamp)
  const float* A = nullptr;   // [n_heads]; A = -exp(A_log), negative
  const float* B = nullptr;   // [seqlen, n_groups, d_state], token stride bc_token_stride
  const float* C = nullptr;   // [seqlen, n_groups, d_state], token stride bc_token_stride
  const float* D = nullptr;   // [n_heads]; null: no skip term
  const float* initial_state = nullptr;  // [n_heads, head_dim, d_state], state at start_pos; null: zeros
  float* y = nullptr;  // [seqlen, n_heads, head_dim], token stride y_token_stride; must not alias inputs
  // [n_heads, head_dim, d_state], state at start_pos + seqlen; null: not written; may alias initial_state.
  float* final_state = nullptr;
  // [SsdNumChunkStates(start_pos, seqlen, chunk_size), n_heads, head_dim, d_state]:
  // row i is the state at absolute position (start_pos / chunk_size + 1 + i) * chunk_size,
  // i.e. after the token just before that boundary. May be null.
  float* chunk_states = nullptr;

  int64_t seqlen = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t d_state = 0;
  int64_t n_groups = 1;  // divides n_heads
  int64_t chunk_size = 256;
  int64_t start_pos = 0;  // absolute position of x[0]
  // Internal block length of the chunked algorithm (tokens, on the absolute
  // grid; must divide chunk_size). Part of the numerics: a model keeps one value
  // for every call. 0: the backend's fixed default (CPU: gcd(chunk_size, 32)).
  int64_t block_size = 0;

  int64_t x_token_stride = 0;   // 0: n_heads * head_dim
  int64_t dt_token_stride = 0;  // 0: n_heads
  int64_t bc_token_stride = 0;  // 0: n_groups * d_state
  int64_t y_token_stride = 0;   // 0: n_heads * head_dim
};

// The shape and pointer checks every backend makes before a scan runs:
// kKernelInvalidArgument for a negative seqlen or start_pos, a non-positive
// n_heads, head_dim, d_state, n_groups or chunk_size, n_groups not dividing
// n_heads, a null A, or (seqlen > 0) a null x, dt, B, C or y. block_size is not
// checked here: its default is the backend's own, and the CPU's sequential
// reference scan ignores it.
inline KernelStatus CheckSsdChunkScanParams(const SsdChunkScanParams& p) {
  if (p.seqlen < 0 || p.n_heads <= 0 || p.head_dim <= 0 || p.d_state <= 0 || p.n_groups <= 0 ||
      p.n_heads % p.n_groups != 0 || p.chunk_size <= 0 || p.start_pos < 0) {
    return kKernelInvalidArgument;
  }
  if (p.seqlen > 0 && (p.x == nullptr || p.dt == nullptr || p.B == nullptr || p.C == nullptr || p.y == nullptr)) {
    return kKernelInvalidArgument;
  }
  return p.A != nullptr ? kKernelOk : kKernelInvalidArgument;
}

// One decode step of the recurrence for a batch of sequences, each one token.
// Same arithmetic as one step of the CPU sequential scan (bit-identical there).
struct SelectiveStateUpdateParams {
  // Pool of states [num_slots, n_heads, head_dim, d_state], read and updated in place.
  float* state = nullptr;
  // [batch]: slot of sequence b in `state`; null: slot b. A negative slot marks a
  // padding row: nothing is read or written for it (y row left untouched).
  const int32_t* state_slots = nullptr;
  const float* x = nullptr;   // [batch, n_heads, head_dim], row stride x_batch_stride
  const float* dt = nullptr;  // [batch, n_heads], row stride dt_batch_stride; after bias and softplus
  const float* A = nullptr;   // [n_heads]
  const float* B = nullptr;   // [batch, n_groups, d_state], row stride bc_batch_stride
  const float* C = nullptr;   // [batch, n_groups, d_state], row stride bc_batch_stride
  const float* D = nullptr;   // [n_heads]; null: no skip term
  const float* z = nullptr;   // [batch, n_heads, head_dim], row stride z_batch_stride; null: no gate, else y *= silu(z)
  float* y = nullptr;         // [batch, n_heads, head_dim], row stride y_batch_stride

  int64_t batch = 0;
  int64_t num_slots = 0;  // rows of `state`; slots are checked against it
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t d_state = 0;
  int64_t n_groups = 1;

  int64_t x_batch_stride = 0;   // 0: n_heads * head_dim
  int64_t dt_batch_stride = 0;  // 0: n_heads
  int64_t bc_batch_stride = 0;  // 0: n_groups * d_state
  int64_t z_batch_stride = 0;   // 0: n_heads * head_dim
  int64_t y_batch_stride = 0;   // 0: n_heads * head_dim
};

// The checks of the host-visible fields every backend makes before the kernel
// runs: kKernelInvalidArgument for a null state, x, dt, A, B, C or y, a
// negative batch, a non-positive shape, or n_groups not dividing n_heads.
// state_slots is device memory: each backend checks its entries its own way
// (kernels/cpu rejects the call; kernels/cuda skips the row and raises its
// error flag).
inline KernelStatus CheckSelectiveStateUpdateParams(const SelectiveStateUpdateParams& p) {
  if (p.state == nullptr || p.x == nullptr || p.dt == nullptr || p.A == nullptr || p.B == nullptr || p.C == nullptr ||
      p.y == nullptr || p.batch < 0 || p.n_heads <= 0 || p.head_dim <= 0 || p.d_state <= 0 || p.n_groups <= 0 ||
      p.n_heads % p.n_groups != 0) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_SSD_PARAMS_H_
