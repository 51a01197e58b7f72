#include "kernels/cpu/activations.h"

#include <algorithm>

#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {

int Activation(const ActivationParams& p, ThreadPool* pool) {
  if (const int status = CheckActivationParams(p); status != kKernelOk) return status;
  const int64_t xs = p.x_row_stride ? p.x_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ParallelForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* x = p.x + r * xs;
    float* out = p.out + r * os;
    switch (p.kind) {
      case ActivationKind::kSilu:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Silu(x[i]);
        break;
      case ActivationKind::kReluSquared:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = ReluSquared(x[i]);
        break;
      case ActivationKind::kSoftplus:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Softplus(x[i]);
        break;
      case ActivationKind::kScale:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = p.alpha * x[i];
        break;
      case ActivationKind::kGelu:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Gelu(x[i]);
        break;
      case ActivationKind::kSigmoid:
        for (int64_t i = 0; i < p.dim; ++i) out[i] = Sigmoid(x[i]);
        break;
    }
  });
  return kKernelOk;
}

int SwiGlu(const SwiGluParams& p, ThreadPool* pool) {
  if (const int status = CheckSwiGluParams(p); status != kKernelOk) return status;
  const int64_t gs = p.gate_row_stride ? p.gate_row_stride : p.dim;
  const int64_t us = p.up_row_stride ? p.up_row_stride : p.dim;
  const int64_t os = p.out_row_stride ? p.out_row_stride : p.dim;
  ParallelForRows(pool, p.n_rows, p.dim, [&](int64_t r) {
    const float* g = p.gate + r * gs;
    const float* u = p.up + r * us;
    float* out = p.out + r * os;
    if (p.gate_activation == ActivationKind::kGelu) {
      for (int64_t i = 0; i < p.dim; ++i) out[i] = Gelu(g[i]) * u[i];
    } else if (p.gate_activation == ActivationKind::kSigmoid) {
      for (int64_t i = 0; i < p.dim; ++i) out[i] = Sigmoid(g[i]) * u[i];
    } else {
      for (int64_t i = 0; i < p.dim; ++i) out[i] = Silu(g[i]) * u[i];
    }
  });
  return kKernelOk;
}

int DtSoftplus(const DtSoftplusParams& p, ThreadPool* pool) {
  if (const int status = CheckDtSoftplusParams(p); status != kKernelOk) return status;
  const int64_t rs = p.dt_raw_row_stride ? p.dt_raw_row_stride : p.n_heads;
  const int64_t ds = p.dt_row_stride ? p.dt_row_stride : p.n_heads;
  ParallelForRows(pool, p.n_tokens, p.n_heads, [&](int64_t t) {
    const float* raw = p.dt_raw + t * rs;
    float* dt = p.dt + t * ds;
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const float v = Softplus(p.dt_bias ? raw[h] + p.dt_bias[h] : raw[h]);
      dt[h] = std::min(std::max(v, p.dt_min), p.dt_max);
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
