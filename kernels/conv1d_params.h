#ifndef HYBRIDSERVE_KERNELS_CONV1D_PARAMS_H_
#define HYBRIDSERVE_KERNELS_CONV1D_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// Causal depthwise conv1d of Mamba2 over the xBC channels:
//   out[t, c] = act(bias[c] + sum_{k=0}^{d_conv-1} weight[c, k] * in[t + k - (d_conv - 1), c])
// where positions before the call's first token come from the conv state.
// Each output element is summed in the fixed order bias, k = 0, 1, ..., d_conv-1
// (fused multiply-adds), so the prefill form gives the same bits wherever a
// sequence is split (with the state carried), and the one-step update form gives
// the same bits as the prefill form.

// Prefill form: one sequence, seqlen tokens.
struct CausalConv1dParams {
  const float* x = nullptr;       // [seqlen, channels], token stride x_token_stride
  const float* weight = nullptr;  // [channels, d_conv] (HF conv1d.weight [channels, 1, d_conv])
  const float* bias = nullptr;    // [channels]; null: no bias
  // [channels, d_conv - 1]: on entry the inputs at positions start-(d_conv-1) .. start-1
  // (oldest first; zeros at the start of a sequence), on return the last d_conv-1
  // inputs of the sequence so far. Null: zeros on entry, nothing written.
  float* conv_state = nullptr;
  float* out = nullptr;  // [seqlen, channels], token stride out_token_stride; must not alias x or conv_state

  int64_t seqlen = 0;
  int64_t channels = 0;
  int64_t d_conv = 4;  // >= 1
  bool silu = true;    // apply SiLU to the output

  int64_t x_token_stride = 0;    // 0: channels
  int64_t out_token_stride = 0;  // 0: channels
};

// The argument checks every backend makes before the kernel runs:
// kKernelInvalidArgument for a null x, weight or out, a negative seqlen,
// channels < 1 or d_conv < 1.
inline KernelStatus CheckCausalConv1dParams(const CausalConv1dParams& p) {
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr || p.seqlen < 0 || p.channels <= 0 || p.d_conv < 1) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

// One-step update form: one new token for each of `batch` sequences.
struct CausalConv1dUpdateParams {
  const float* x = nullptr;       // [batch, channels], row stride x_batch_stride
  const float* weight = nullptr;  // [channels, d_conv]
  const float* bias = nullptr;    // [channels]; null: no bias
  // Pool [num_slots, channels, d_conv - 1] with the same meaning as
  // CausalConv1dParams::conv_state; updated in place (shifted by one, x appended).
  float* conv_state = nullptr;
  // [batch]: slot of sequence b in conv_state; null: slot b. Negative: padding
  // row, nothing read or written.
  const int32_t* state_slots = nullptr;
  float* out = nullptr;  // [batch, channels], row stride out_batch_stride; must not alias x

  int64_t batch = 0;
  int64_t num_slots = 0;
  int64_t channels = 0;
  int64_t d_conv = 4;
  bool silu = true;

  int64_t x_batch_stride = 0;    // 0: channels
  int64_t out_batch_stride = 0;  // 0: channels
};

// The checks of the host-visible fields every backend makes before the kernel
// runs: kKernelInvalidArgument for a null x, weight, out or conv_state, a
// negative batch, channels < 1, d_conv < 1, or (without state_slots) batch >
// num_slots. state_slots is device memory: each backend checks its entries its
// own way (kernels/cpu and kernels/cuda).
inline KernelStatus CheckCausalConv1dUpdateParams(const CausalConv1dUpdateParams& p) {
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr || p.conv_state == nullptr || p.batch < 0 ||
      p.channels <= 0 || p.d_conv < 1) {
    return kKernelInvalidArgument;
  }
  if (p.state_slots == nullptr && p.batch > p.num_slots) return kKernelInvalidArgument;
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_CONV1D_PARAMS_H_
