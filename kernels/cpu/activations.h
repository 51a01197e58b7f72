#ifndef HYBRIDSERVE_KERNELS_CPU_ACTIVATIONS_H_
#define HYBRIDSERVE_KERNELS_CPU_ACTIVATIONS_H_

#include <cmath>

#include "kernels/activation_params.h"
#include "kernels/cpu/thread_pool.h"

namespace hybridserve::kernels::cpu {

// Scalar activations shared by every CPU kernel that applies them (conv1d,
// state update, gated norm, MLP), so the same input always gives the same bits.
// glibc's expf/log1pf are deterministic for a given input.
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.sigmoid in fp32: 1 / (1 + exp(-x)).
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

inline float ReluSquared(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}

// torch.nn.functional.gelu (approximate="none") in the order of torch's scalar
// CPU GeluKernel for float: x * 0.5 * (1 + erf(x * kAlpha)), kAlpha = M_SQRT1_2
// rounded to fp32, every operation in fp32 with glibc's erff (torch's
// vectorized path uses a polynomial erf and may differ by an ulp or two).
inline float Gelu(float x) {
  constexpr float kAlpha = 0.70710678118654752440f;  // M_SQRT1_2
  return x * 0.5f * (1.0f + std::erf(x * kAlpha));
}

// Launchers; return a KernelStatus. pool may be null (runs on the caller).
int Activation(const ActivationParams& p, ThreadPool* pool);
int SwiGlu(const SwiGluParams& p, ThreadPool* pool);
int DtSoftplus(const DtSoftplusParams& p, ThreadPool* pool);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_ACTIVATIONS_H_
