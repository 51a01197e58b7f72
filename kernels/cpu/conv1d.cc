#include "kernels/cpu/conv1d.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/activations.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Channels per parallel task; a multiple of 8 keeps tasks on cache lines.
constexpr int64_t kChannelsPerTask = 256;

inline float Finish(float acc, bool silu) { return silu ? Silu(acc) : acc; }

}  // namespace

int CausalConv1d(const CausalConv1dParams& p, ThreadPool* pool) {
  if (const int status = CheckCausalConv1dParams(p); status != kKernelOk) return status;
  const int64_t xs = p.x_token_stride ? p.x_token_stride : p.channels;
  const int64_t os = p.out_token_stride ? p.out_token_stride : p.channels;
  const int64_t w = p.d_conv;
  const int64_t hist = w - 1;  // conv state columns
  const int64_t tasks = (p.channels + kChannelsPerTask - 1) / kChannelsPerTask;

  ParallelFor(pool, tasks, [&](int64_t task_begin, int64_t task_end) {
    const int64_t c0 = task_begin * kChannelsPerTask;
    const int64_t c1 = std::min(p.channels, task_end * kChannelsPerTask);
    // Input at relative position j (may be negative: from the conv state) of channel c.
    auto input = [&](int64_t j, int64_t c) -> float {
      if (j >= 0) return p.x[j * xs + c];
      return p.conv_state ? p.conv_state[c * hist + hist + j] : 0.0f;
    };
    for (int64_t t = 0; t < p.seqlen; ++t) {
      float* out = p.out + t * os;
      if (t >= hist) {
        const float* xt = p.x + (t - hist) * xs;
        for (int64_t c = c0; c < c1; ++c) {
          const float* wc = p.weight + c * w;
          float acc = p.bias ? p.bias[c] : 0.0f;
          for (int64_t k = 0; k < w; ++k) acc = std::fma(wc[k], xt[k * xs + c], acc);
          out[c] = Finish(acc, p.silu);
        }
      } else {
        for (int64_t c = c0; c < c1; ++c) {
          const float* wc = p.weight + c * w;
          float acc = p.bias ? p.bias[c] : 0.0f;
          for (int64_t k = 0; k < w; ++k) acc = std::fma(wc[k], input(t + k - hist, c), acc);
          out[c] = Finish(acc, p.silu);
        }
      }
    }
    if (p.conv_state != nullptr && hist > 0) {
      // New state: inputs at relative positions seqlen-hist .. seqlen-1. Reading
      // oldest first lets the in-place shift read each old value before overwriting it.
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t j = 0; j < hist; ++j) {
          p.conv_state[c * hist + j] = input(p.seqlen - hist + j, c);
        }
      }
    }
  });
  return kKernelOk;
}

int CausalConv1dUpdate(const CausalConv1dUpdateParams& p, ThreadPool* pool) {
  if (const int status = CheckCausalConv1dUpdateParams(p); status != kKernelOk) return status;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t slot = p.state_slots ? p.state_slots[b] : b;
    if (slot >= p.num_slots) return kKernelInvalidArgument;
  }
  const int64_t xs = p.x_batch_stride ? p.x_batch_stride : p.channels;
  const int64_t os = p.out_batch_stride ? p.out_batch_stride : p.channels;
  const int64_t w = p.d_conv;
  const int64_t hist = w - 1;
  const int64_t tasks = (p.channels + kChannelsPerTask - 1) / kChannelsPerTask;

  ParallelFor(pool, tasks, [&](int64_t task_begin, int64_t task_end) {
    const int64_t c0 = task_begin * kChannelsPerTask;
    const int64_t c1 = std::min(p.channels, task_end * kChannelsPerTask);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t slot = p.state_slots ? p.state_slots[b] : b;
      if (slot < 0) continue;
      float* state = p.conv_state + slot * p.channels * hist;
      const float* x = p.x + b * xs;
      float* out = p.out + b * os;
      for (int64_t c = c0; c < c1; ++c) {
        const float* wc = p.weight + c * w;
        float* sc = state + c * hist;
        float acc = p.bias ? p.bias[c] : 0.0f;
        for (int64_t k = 0; k < hist; ++k) acc = std::fma(wc[k], sc[k], acc);
        acc = std::fma(wc[hist], x[c], acc);
        out[c] = Finish(acc, p.silu);
        for (int64_t k = 0; k + 1 < hist; ++k) sc[k] = sc[k + 1];
        if (hist > 0) sc[hist - 1] = x[c];
      }
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
