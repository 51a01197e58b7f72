#ifndef HYBRIDSERVE_KERNELS_ACTIVATION_PARAMS_H_
#define HYBRIDSERVE_KERNELS_ACTIVATION_PARAMS_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels {

// Elementwise activations. Every element is a function of its inputs only.
//   silu(x)     = x / (1 + exp(-x))
//   softplus(x) = x > 20 ? x : log1p(exp(x))          (torch's threshold 20)
//   relu2(x)    = max(x, 0)^2                         (Nemotron-H MLP)
//   gelu(x)     = x * 0.5 * (1 + erf(x * M_SQRT1_2))  (exact erf form: transformers'
//                                                      ACT2FN["gelu"], torch's scalar
//                                                      CPU kernel's order, in fp32)
//   scale(x)    = alpha * x                           (one fp32 multiply: bit-exact on
//                                                      every backend; Granite's
//                                                      embedding and logits multipliers)
//   sigmoid(x)  = 1 / (1 + exp(-x))                   (torch.sigmoid in fp32; Qwen3-Next's
//                                                      attention output gate)
enum class ActivationKind : int {
  kSilu = 0,
  kReluSquared = 1,
  kSoftplus = 2,
  kScale = 3,
  kGelu = 4,
  kSigmoid = 5,
};

// out = act(x), row by row.
struct ActivationParams {
  const float* x = nullptr;  // [n_rows, dim], row stride x_row_stride
  float* out = nullptr;      // [n_rows, dim], row stride out_row_stride; may alias x exactly
  int64_t n_rows = 0;
  int64_t dim = 0;
  ActivationKind kind = ActivationKind::kSilu;
  float alpha = 1.0f;          // kScale's multiplier (finite); unused by the other kinds
  int64_t x_row_stride = 0;    // 0: dim
  int64_t out_row_stride = 0;  // 0: dim
};

// The argument checks every backend makes before an activation kernel runs:
// kKernelInvalidArgument for a null pointer, a negative shape, an unknown kind
// or a non-finite alpha (checked for every kind).
inline KernelStatus CheckActivationParams(const ActivationParams& p) {
  if (p.x == nullptr || p.out == nullptr || p.n_rows < 0 || p.dim < 0 || !std::isfinite(p.alpha)) {
    return kKernelInvalidArgument;
  }
  switch (p.kind) {
    case ActivationKind::kSilu:
    case ActivationKind::kReluSquared:
    case ActivationKind::kSoftplus:
    case ActivationKind::kScale:
    case ActivationKind::kGelu:
    case ActivationKind::kSigmoid:
      return kKernelOk;
  }
  return kKernelInvalidArgument;
}

// Gated activation: out = act(gate) * up, act = gate_activation: silu
// (SwiGLU, the default), gelu (Zamba2's MLP) or sigmoid (Qwen3-Next's gated
// attention: attn_output * torch.sigmoid(gate)). gate and up may be the two
// halves of one fused projection output (gate = buf, up = buf + dim, both with
// row stride 2 * dim).
struct SwiGluParams {
  const float* gate = nullptr;  // [n_rows, dim], row stride gate_row_stride
  const float* up = nullptr;    // [n_rows, dim], row stride up_row_stride
  float* out = nullptr;         // [n_rows, dim], row stride out_row_stride; may alias gate or up exactly
  int64_t n_rows = 0;
  int64_t dim = 0;
  // act: kSilu (the default: SwiGLU), kGelu or kSigmoid; the others are rejected.
  ActivationKind gate_activation = ActivationKind::kSilu;
  int64_t gate_row_stride = 0;  // 0: dim
  int64_t up_row_stride = 0;    // 0: dim
  int64_t out_row_stride = 0;   // 0: dim
};

// kKernelInvalidArgument for a null pointer, a negative shape or a
// gate_activation other than kSilu, kGelu and kSigmoid.
inline KernelStatus CheckSwiGluParams(const SwiGluParams& p) {
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr || p.n_rows < 0 || p.dim < 0) {
    return kKernelInvalidArgument;
  }
  switch (p.gate_activation) {
    case ActivationKind::kSilu:
    case ActivationKind::kGelu:
    case ActivationKind::kSigmoid:
      return kKernelOk;
    case ActivationKind::kReluSquared:
    case ActivationKind::kSoftplus:
    case ActivationKind::kScale:
      break;
  }
  return kKernelInvalidArgument;
}

// Mamba2 time step: dt[t, h] = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_min, dt_max).
struct DtSoftplusParams {
  const float* dt_raw = nullptr;   // [n_tokens, n_heads], row stride dt_raw_row_stride (slice of in_proj output)
  const float* dt_bias = nullptr;  // [n_heads]; null: no bias
  float* dt = nullptr;             // [n_tokens, n_heads], row stride dt_row_stride
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  float dt_min = 0.0f;  // HF time_step_limit (0, inf) by default
  float dt_max = std::numeric_limits<float>::infinity();
  int64_t dt_raw_row_stride = 0;  // 0: n_heads
  int64_t dt_row_stride = 0;      // 0: n_heads
};

// kKernelInvalidArgument for a null pointer, a negative shape or dt_min > dt_max (or NaN).
inline KernelStatus CheckDtSoftplusParams(const DtSoftplusParams& p) {
  if (p.dt_raw == nullptr || p.dt == nullptr || p.n_tokens < 0 || p.n_heads < 0 || !(p.dt_min <= p.dt_max)) {
    return kKernelInvalidArgument;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_ACTIVATION_PARAMS_H_
