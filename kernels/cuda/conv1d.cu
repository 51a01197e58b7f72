// Mamba2's causal depthwise conv1d on CUDA: the prefill form (CausalConv1d)
// and the batched one-token update (CausalConv1dUpdate); semantics in
// kernels/conv1d_params.h, reference kernels/cpu/conv1d.cc. Built by nvcc and
// by the host compiler against the CUDA emulator (kernels/cuda/launchers.h).
//
// Every output element is acc = bias (or 0), then acc = fmaf(w[k], in[k], acc)
// for k = 0 .. d_conv-1 (oldest input first), then SiLU if asked: the CPU's
// order and operations. Without SiLU the result has the CPU's bits on a GPU
// too; with SiLU it differs by the GPU expf's last-bit error (the emulator
// gives the CPU's bits). The prefill form split anywhere (state carried) and
// the update form give the same bits as one prefill call, on any target.
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

constexpr int kConvThreads = 128;     // channels per block
constexpr int kTokensPerThread = 16;  // prefill: consecutive tokens of one channel per thread
constexpr int64_t kMaxGridX = int64_t{1} << 30;
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + expf(-x)); }

struct ConvArgs {
  const float* x;
  const float* weight;
  const float* bias;
  float* conv_state;  // read only by the conv kernel; rewritten by ConvStateKernel afterwards
  float* out;
  int64_t seqlen;
  int64_t channels;
  int64_t d_conv;
  int64_t xs;
  int64_t os;
  bool silu;
};

// Input at relative position j (negative: from the entry conv state) of channel c.
__device__ __forceinline__ float ConvInput(const ConvArgs& a, int64_t j, int64_t c, int64_t hist) {
  if (j >= 0) return a.x[j * a.xs + c];
  return a.conv_state != nullptr ? a.conv_state[c * hist + hist + j] : 0.0f;
}

// Thread (channel c, tokens [t0, t0 + kTokensPerThread)). kWidth > 0: d_conv
// known at compile time, weights and a sliding window of inputs in registers;
// kWidth == 0: any d_conv, everything from memory. Blocks: x = token tile,
// y = channel tile (grid-stride over both).
template <int kWidth>
__global__ void __launch_bounds__(kConvThreads) ConvPrefillKernel(ConvArgs a) {
  const int64_t w = kWidth > 0 ? kWidth : a.d_conv;
  const int64_t hist = w - 1;
  const int64_t token_tiles = CeilDiv(a.seqlen, kTokensPerThread);
  const int64_t channel_tiles = CeilDiv(a.channels, kConvThreads);
  for (int64_t ct = blockIdx.y; ct < channel_tiles; ct += gridDim.y) {
    const int64_t c = ct * kConvThreads + threadIdx.x;
    if (c >= a.channels) continue;
    const float bias = a.bias != nullptr ? a.bias[c] : 0.0f;
    const float* wc = a.weight + c * w;
    for (int64_t tt = blockIdx.x; tt < token_tiles; tt += gridDim.x) {
      const int64_t t0 = tt * kTokensPerThread;
      const int64_t t1 = Min<int64_t>(a.seqlen, t0 + kTokensPerThread);
      if constexpr (kWidth > 0) {
        float wr[kWidth];
        float win[kWidth];  // win[k]: input at position t + k - hist
#pragma unroll
        for (int k = 0; k < kWidth; ++k) wr[k] = wc[k];
#pragma unroll
        for (int k = 0; k + 1 < kWidth; ++k) win[k] = ConvInput(a, t0 + k - hist, c, hist);
        for (int64_t t = t0; t < t1; ++t) {
          win[kWidth - 1] = a.x[t * a.xs + c];
          float acc = bias;
#pragma unroll
          for (int k = 0; k < kWidth; ++k) acc = fmaf(wr[k], win[k], acc);
          a.out[t * a.os + c] = a.silu ? SiluF(acc) : acc;
#pragma unroll
          for (int k = 0; k + 1 < kWidth; ++k) win[k] = win[k + 1];
        }
      } else {
        for (int64_t t = t0; t < t1; ++t) {
          float acc = bias;
          for (int64_t k = 0; k < w; ++k) acc = fmaf(wc[k], ConvInput(a, t + k - hist, c, hist), acc);
          a.out[t * a.os + c] = a.silu ? SiluF(acc) : acc;
        }
      }
    }
  }
}

// After ConvPrefillKernel (same stream: every read of the entry state is
// done): state[c][j] = input at position seqlen - hist + j. One thread per
// channel, j ascending, so an entry-state value still needed (j + seqlen < hist
// reads old index j + seqlen > j) is read before it is overwritten.
__global__ void __launch_bounds__(kConvThreads) ConvStateKernel(ConvArgs a) {
  const int64_t hist = a.d_conv - 1;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < a.channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t j = 0; j < hist; ++j) {
      a.conv_state[c * hist + j] = ConvInput(a, a.seqlen - hist + j, c, hist);
    }
  }
}

struct ConvUpdateArgs {
  const float* x;
  const float* weight;
  const float* bias;
  float* conv_state;
  const int32_t* state_slots;
  float* out;
  int64_t batch;
  int64_t num_slots;
  int64_t channels;
  int64_t d_conv;
  int64_t xs;
  int64_t os;
  bool silu;
  int32_t* error_flag;
};

// Thread (row b, channel c); block x = channel tile + row * channel_tiles
// (grid-stride). Each thread owns state[slot][c][:]: reads it, then shifts it.
__global__ void __launch_bounds__(kConvThreads) ConvUpdateKernel(ConvUpdateArgs a) {
  const int64_t hist = a.d_conv - 1;
  const int64_t channel_tiles = CeilDiv(a.channels, kConvThreads);
  for (int64_t blk = blockIdx.x; blk < a.batch * channel_tiles; blk += gridDim.x) {
    const int64_t b = blk / channel_tiles;
    const int64_t c = (blk % channel_tiles) * kConvThreads + threadIdx.x;
    if (c >= a.channels) continue;
    const int64_t slot = a.state_slots != nullptr ? a.state_slots[b] : b;
    if (slot < 0) continue;  // padding row
    if (slot >= a.num_slots) {
      if (c == 0) ReportBadIndex(a.error_flag);
      continue;
    }
    float* sc = a.conv_state + (slot * a.channels + c) * hist;
    const float* wc = a.weight + c * a.d_conv;
    const float xv = a.x[b * a.xs + c];
    float acc = a.bias != nullptr ? a.bias[c] : 0.0f;
    for (int64_t k = 0; k < hist; ++k) acc = fmaf(wc[k], sc[k], acc);
    acc = fmaf(wc[hist], xv, acc);
    a.out[b * a.os + c] = a.silu ? SiluF(acc) : acc;
    for (int64_t k = 0; k + 1 < hist; ++k) sc[k] = sc[k + 1];
    if (hist > 0) sc[hist - 1] = xv;
  }
}

}  // namespace

int CausalConv1d(const CausalConv1dParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckCausalConv1dParams(p); status != kKernelOk) return status;
  if (p.seqlen == 0) return kKernelOk;  // no output; the state is unchanged
  ConvArgs a{};
  a.x = p.x;
  a.weight = p.weight;
  a.bias = p.bias;
  a.conv_state = p.conv_state;
  a.out = p.out;
  a.seqlen = p.seqlen;
  a.channels = p.channels;
  a.d_conv = p.d_conv;
  a.xs = p.x_token_stride ? p.x_token_stride : p.channels;
  a.os = p.out_token_stride ? p.out_token_stride : p.channels;
  a.silu = p.silu;

  const int64_t channel_tiles = CeilDiv(p.channels, kConvThreads);
  const dim3 grid(static_cast<unsigned int>(Min(CeilDiv(p.seqlen, kTokensPerThread), kMaxGridX)),
                  static_cast<unsigned int>(Min(channel_tiles, kMaxGridY)));
  const dim3 block(kConvThreads);
  cudaError_t err;
  switch (p.d_conv) {
    case 1:
      err = Launch(ConvPrefillKernel<1>, grid, block, 0, ctx.stream, a);
      break;
    case 2:
      err = Launch(ConvPrefillKernel<2>, grid, block, 0, ctx.stream, a);
      break;
    case 3:
      err = Launch(ConvPrefillKernel<3>, grid, block, 0, ctx.stream, a);
      break;
    case 4:
      err = Launch(ConvPrefillKernel<4>, grid, block, 0, ctx.stream, a);
      break;
    default:
      err = Launch(ConvPrefillKernel<0>, grid, block, 0, ctx.stream, a);
      break;
  }
  if (err != cudaSuccess || p.conv_state == nullptr || p.d_conv == 1) return LaunchStatus(err);
  const int64_t state_blocks = Min(channel_tiles, kMaxGridX);
  return LaunchStatus(Launch(ConvStateKernel, dim3(static_cast<unsigned int>(state_blocks)), block, 0, ctx.stream, a));
}

int CausalConv1dUpdate(const CausalConv1dUpdateParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckCausalConv1dUpdateParams(p); status != kKernelOk) return status;
  if (p.batch == 0) return kKernelOk;
  ConvUpdateArgs a{};
  a.x = p.x;
  a.weight = p.weight;
  a.bias = p.bias;
  a.conv_state = p.conv_state;
  a.state_slots = p.state_slots;
  a.out = p.out;
  a.batch = p.batch;
  a.num_slots = p.num_slots;
  a.channels = p.channels;
  a.d_conv = p.d_conv;
  a.xs = p.x_batch_stride ? p.x_batch_stride : p.channels;
  a.os = p.out_batch_stride ? p.out_batch_stride : p.channels;
  a.silu = p.silu;
  a.error_flag = ctx.error_flag;
  const int64_t blocks = Min(p.batch * CeilDiv(p.channels, kConvThreads), kMaxGridX);
  return LaunchStatus(
      Launch(ConvUpdateKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kConvThreads), 0, ctx.stream, a));
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
