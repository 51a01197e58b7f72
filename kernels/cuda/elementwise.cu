// Elementwise and per-row CUDA kernels: Embedding, RmsNorm, GatedRmsNorm,
// Activation, SwiGlu, DtSoftplus, Rope, GatherRows, ScatterAddRows and MoeCombine
// (semantics: kernels/*_params.h; the
// CPU kernels of kernels/cpu are the reference). Built by nvcc and by the host
// compiler against the CUDA emulator (kernels/cuda/launchers.h).
//
// Arithmetic notes (what the tests rely on):
//   - Activations use expf/log1pf/erff (never the __expf intrinsics): the
//     emulator gives the CPU's bits; a GPU is within a few ulp. GELU is written
//     with __fmul_rn/__fadd_rn in the CPU's order (x * 0.5 * (1 + erff(x *
//     kAlpha))); a GPU's erff is within 2 ulp, so its GELU is within a few ulp
//     of the CPU's for x > 0 and within a few ulp of 1, times |x| / 2, where
//     1 + erf cancels (x < 0). kScale is one round-to-nearest multiply
//     (__fmul_rn): the CPU's bits on every target.
//   - Norms: a row (or group) of n elements is reduced by S threads, S a
//     function of n only (SegmentThreads). Thread l accumulates, with fmaf, the
//     elements of the 4-element chunks l, l + S, l + 2S, ... in ascending
//     order; the S partial sums are combined by WarpSum (S = 32) or BlockSum.
//     The order depends only on n: never on n_rows, the row's position, its
//     alignment or whether the loads were vectorized. It differs from the CPU's
//     8-lane order, so norms match the CPU to rounding, not bitwise.
//   - Rope: the inverse frequencies are computed on the host exactly as the CPU
//     does (std::pow in double) and passed by value; the angle and its cos/sin
//     are computed in double on the device, then rounded to fp32; the rotation
//     is written with explicit round-to-nearest multiplies and adds (no FMA
//     contraction), as the CPU (built with -ffp-contract=off) computes it.
//   - GatherRows copies; ScatterAddRows is written with __fmul_rn/__fadd_rn in
//     the order of its params' definition: both the CPU's bits on every target.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

// Grid-stride loops cap the grid here (any count of blocks is covered).
constexpr int64_t kMaxGridBlocks = int64_t{1} << 30;

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float ReluSquaredF(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}
// The CPU's Gelu (kernels/cpu/activations.h), operation for operation.
__device__ __forceinline__ float GeluF(float x) {
  constexpr float kAlpha = 0.70710678118654752440f;  // M_SQRT1_2
  return __fmul_rn(__fmul_rn(x, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(x, kAlpha))));
}

// 16- and 8-byte vectors for single-instruction loads and stores, declared
// here so that both builds (nvcc and the emulator) use the same types.
struct alignas(16) Vec4f {
  float v[4];
};
struct alignas(8) Vec4h {
  uint16_t v[4];
};

__host__ __device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Loads elements [i, i + count) of p (count <= 4); vec: one 16-byte load
// (count == 4 and p + i 16-byte aligned). Unloaded lanes are 0.
__device__ __forceinline__ void Load4(const float* p, int64_t i, int count, bool vec, float v[4]) {
  if (vec) {
    const Vec4f q = *reinterpret_cast<const Vec4f*>(p + i);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = q.v[k];
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = k < count ? p[i + k] : 0.0f;
}

__device__ __forceinline__ void Store4(float* p, int64_t i, int count, bool vec, const float v[4]) {
  if (vec) {
    Vec4f q;
#pragma unroll
    for (int k = 0; k < 4; ++k) q.v[k] = v[k];
    *reinterpret_cast<Vec4f*>(p + i) = q;
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (k < count) p[i + k] = v[k];
  }
}

// ---------------------------------------------------------------- Embedding

constexpr int kEmbeddingThreads = 128;

struct EmbeddingArgs {
  const float* table;
  const uint16_t* table_bf16;
  const int32_t* tokens;
  float* out;
  int64_t n_tokens;
  int64_t vocab;
  int64_t dim;
  bool vec;  // 4-element chunks: 16-byte loads of fp32 rows, 8-byte of bf16, 16-byte stores
  int32_t* error_flag;
};

// One block per token row (grid-stride); threads copy 4-element chunks.
__global__ void __launch_bounds__(kEmbeddingThreads) EmbeddingKernel(EmbeddingArgs a) {
  for (int64_t t = blockIdx.x; t < a.n_tokens; t += gridDim.x) {
    const int32_t token = a.tokens[t];
    if (token < 0 || token >= a.vocab) {
      if (threadIdx.x == 0) ReportBadIndex(a.error_flag);
      continue;
    }
    const int64_t row = static_cast<int64_t>(token) * a.dim;
    float* out = a.out + t * a.dim;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * 4; i < a.dim; i += static_cast<int64_t>(blockDim.x) * 4) {
      const int count = static_cast<int>(Min<int64_t>(4, a.dim - i));
      float v[4];
      if (a.table != nullptr) {
        Load4(a.table + row, i, count, a.vec, v);
      } else if (a.vec) {
        const Vec4h q = *reinterpret_cast<const Vec4h*>(a.table_bf16 + row + i);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = Bf16ToFloat(q.v[k]);
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = k < count ? Bf16ToFloat(a.table_bf16[row + i + k]) : 0.0f;
      }
      Store4(out, i, count, a.vec, v);
    }
  }
}

// ---------------------------------------------------------------- Norms

constexpr int kWarpSegmentsPerBlock = 4;  // warp mode: 128-thread blocks, one segment per warp
constexpr int kMaxSegmentThreads = 512;   // block mode: one segment per block of up to this many threads

enum class NormMode : int {
  kPlain = 0,      // rmsnorm(x) * w
  kGateFirst = 1,  // rmsnorm(x * silu(z)) * w
  kNormFirst = 2,  // rmsnorm(x) * w * silu(z)
};

struct NormArgs {
  const float* x;
  const float* z;
  const float* weight;
  float* out;
  int64_t n_rows;
  int64_t dim;
  int64_t group_size;  // segment length n
  int64_t groups;      // dim / group_size
  int64_t x_stride;
  int64_t z_stride;
  int64_t out_stride;
  float eps;
  NormMode mode;
  int seg_threads;  // S: 32 (one warp per segment) or blockDim.x (one block per segment)
  bool vec;         // every row and group start 16-byte aligned and group_size % 4 == 0
};

// Threads per segment of n elements: a function of n only (the reduction
// order depends on it). A warp up to 256 elements (<= 2 chunks per lane),
// else ~8 elements per thread, 64..512 threads. A decode step's norms are one
// row each: with a warp per 1024-element row (the first rule) each took 9 us on
// an H200, a lane's 8 loads one after another.
inline int SegmentThreads(int64_t n) {
  if (n <= 256) return 32;
  const int64_t t = CeilDiv(CeilDiv(n, 8), 32) * 32;
  return static_cast<int>(Max<int64_t>(64, Min<int64_t>(kMaxSegmentThreads, t)));
}

// The value whose square is summed (and that is scaled) for element k of a chunk.
__device__ __forceinline__ float NormInput(const NormArgs& a, float xv, float zv) {
  return a.mode == NormMode::kGateFirst ? xv * SiluF(zv) : xv;
}

// One segment (row r, group g) per warp or per block (grid-stride over segments).
__global__ void __launch_bounds__(kMaxSegmentThreads) NormKernel(NormArgs a) {
  __shared__ float scratch[32];
  const int S = a.seg_threads;
  const int per_block = static_cast<int>(blockDim.x) / S;
  const int lane = static_cast<int>(threadIdx.x) % S;
  const int64_t n = a.group_size;
  const int64_t n_segments = a.n_rows * a.groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * per_block;
  // Every thread of a block runs the same number of iterations (block mode
  // needs it for BlockSum's barriers); warps past the end skip the work.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * per_block; base < n_segments; base += stride) {
    const int64_t seg = base + static_cast<int64_t>(threadIdx.x) / S;
    const bool active = seg < n_segments;
    const int64_t r = active ? seg / a.groups : 0;
    const int64_t g0 = active ? (seg % a.groups) * n : 0;
    const float* x = a.x + r * a.x_stride + g0;
    const float* z = a.z != nullptr ? a.z + r * a.z_stride + g0 : nullptr;
    const float* w = a.weight != nullptr ? a.weight + g0 : nullptr;
    float* out = a.out + r * a.out_stride + g0;

    float acc = 0.0f;
    if (active) {
      for (int64_t i = static_cast<int64_t>(lane) * 4; i < n; i += static_cast<int64_t>(S) * 4) {
        const int count = static_cast<int>(Min<int64_t>(4, n - i));
        float xv[4], zv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        Load4(x, i, count, a.vec, xv);
        if (a.mode == NormMode::kGateFirst) Load4(z, i, count, a.vec, zv);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (k < count) {
            const float v = NormInput(a, xv[k], zv[k]);
            acc = fmaf(v, v, acc);
          }
        }
      }
    }
    float sum;
    if (S == 32) {
      if (!active) continue;  // the whole warp is past the end
      sum = WarpSum(acc);
    } else {
      sum = BlockSum(acc, scratch);
    }
    if (!active) continue;
    const float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + a.eps);
    // Each thread rewrites exactly the elements it read: out may alias x.
    for (int64_t i = static_cast<int64_t>(lane) * 4; i < n; i += static_cast<int64_t>(S) * 4) {
      const int count = static_cast<int>(Min<int64_t>(4, n - i));
      float xv[4], zv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, wv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ov[4];
      Load4(x, i, count, a.vec, xv);
      if (z != nullptr) Load4(z, i, count, a.vec, zv);
      if (w != nullptr) Load4(w, i, count, a.vec, wv);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float v = NormInput(a, xv[k], zv[k]);
        v = w != nullptr ? (v * inv) * wv[k] : v * inv;
        if (a.mode == NormMode::kNormFirst) v = v * SiluF(zv[k]);
        ov[k] = v;
      }
      Store4(out, i, count, a.vec, ov);
    }
  }
}

int LaunchNorm(const NormArgs& args_in, const CudaLaunchContext& ctx) {
  NormArgs a = args_in;
  const int64_t n_segments = a.n_rows * a.groups;
  if (n_segments == 0) return kKernelOk;
  a.seg_threads = SegmentThreads(a.group_size);
  a.vec = a.group_size % 4 == 0 && Aligned16(a.x) && a.x_stride % 4 == 0 && Aligned16(a.out) && a.out_stride % 4 == 0 &&
          (a.z == nullptr || (Aligned16(a.z) && a.z_stride % 4 == 0)) && (a.weight == nullptr || Aligned16(a.weight));
  const int threads = a.seg_threads == 32 ? 32 * kWarpSegmentsPerBlock : a.seg_threads;
  const int64_t per_block = threads / a.seg_threads;
  const int64_t blocks = Min<int64_t>(CeilDiv(n_segments, per_block), kMaxGridBlocks);
  return LaunchStatus(Launch(NormKernel, dim3(static_cast<unsigned int>(blocks)), dim3(threads), 0, ctx.stream, a));
}

// ---------------------------------------------------------------- Row-wise elementwise ops

constexpr int kRowThreads = 256;
constexpr int64_t kRowChunk = 4 * kRowThreads;  // elements of a row per block

// Each op: Apply(row, i, count, vec) for elements [i, i + count) of `row`.
struct ActivationOp {
  const float* x;
  float* out;
  int64_t xs, os;
  ActivationKind kind;
  float alpha;
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float v[4];
    Load4(x + r * xs, i, count, vec, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      switch (kind) {
        case ActivationKind::kSilu:
          v[k] = SiluF(v[k]);
          break;
        case ActivationKind::kReluSquared:
          v[k] = ReluSquaredF(v[k]);
          break;
        case ActivationKind::kSoftplus:
          v[k] = SoftplusF(v[k]);
          break;
        case ActivationKind::kScale:
          v[k] = __fmul_rn(alpha, v[k]);
          break;
        case ActivationKind::kGelu:
          v[k] = GeluF(v[k]);
          break;
        case ActivationKind::kSigmoid:
          v[k] = SigmoidF(v[k]);
          break;
      }
    }
    Store4(out + r * os, i, count, vec, v);
  }
};

struct SwiGluOp {
  const float* gate;
  const float* up;
  float* out;
  int64_t gs, us, os;
  ActivationKind act;  // gate activation: kSilu, kGelu or kSigmoid
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float g[4], u[4];
    Load4(gate + r * gs, i, count, vec, g);
    Load4(up + r * us, i, count, vec, u);
    if (act == ActivationKind::kGelu) {
#pragma unroll
      for (int k = 0; k < 4; ++k) g[k] = __fmul_rn(GeluF(g[k]), u[k]);
    } else if (act == ActivationKind::kSigmoid) {
#pragma unroll
      for (int k = 0; k < 4; ++k) g[k] = __fmul_rn(SigmoidF(g[k]), u[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) g[k] = SiluF(g[k]) * u[k];
    }
    Store4(out + r * os, i, count, vec, g);
  }
};

struct DtSoftplusOp {
  const float* raw;
  const float* bias;
  float* dt;
  int64_t rs, ds;
  float dt_min, dt_max;
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float v[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    Load4(raw + r * rs, i, count, vec, v);
    if (bias != nullptr) Load4(bias, i, count, vec, b);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float s = SoftplusF(bias != nullptr ? v[k] + b[k] : v[k]);
      v[k] = Min(Max(s, dt_min), dt_max);  // std::min(std::max(s, lo), hi): NaN stays NaN
    }
    Store4(dt + r * ds, i, count, vec, v);
  }
};

// Row r of the output is row index[r] of x. vec is decided from x's base and
// stride, so it holds for every source row alike.
struct GatherRowsOp {
  const float* x;
  const int32_t* index;
  float* out;
  int64_t xs, os;
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float v[4];
    Load4(x + static_cast<int64_t>(index[r]) * xs, i, count, vec, v);
    Store4(out + r * os, i, count, vec, v);
  }
};

// Row r of x is added into row index[r] (or r) of out. Indices are distinct
// (the params' precondition), so no two threads touch one element.
struct ScatterAddRowsOp {
  const float* x;
  const int32_t* index;
  const float* weight;
  float* out;
  int64_t xs, os;
  float alpha;
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float* dst = out + (index != nullptr ? static_cast<int64_t>(index[r]) : r) * os;
    const float w = weight != nullptr ? weight[r] : 1.0f;
    float v[4], o[4];
    Load4(x + r * xs, i, count, vec, v);
    Load4(dst, i, count, vec, o);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = __fadd_rn(o[k], __fmul_rn(__fmul_rn(v[k], w), alpha));
    Store4(dst, i, count, vec, o);
  }
};

// Row r of out gains x[slot] * weights[slot] for its per_row slots in
// order: ScatterAddRowsOp's roundings (alpha 1 is exact), expert by expert.
struct MoeCombineOp {
  const float* x;
  const int32_t* slots;
  const float* weights;
  float* out;
  int64_t xs, os, per_row;
  __device__ __forceinline__ void Apply(int64_t r, int64_t i, int count, bool vec) const {
    float* dst = out + r * os;
    float o[4];
    Load4(dst, i, count, vec, o);
    for (int64_t j = 0; j < per_row; ++j) {
      const int64_t s = slots[r * per_row + j];
      const float w = weights[s];
      float v[4];
      Load4(x + s * xs, i, count, vec, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) o[k] = __fadd_rn(o[k], __fmul_rn(v[k], w));
    }
    Store4(dst, i, count, vec, o);
  }
};

// Wide rows (rows_per_block == 1): block b handles elements
// [(b % blocks_per_row) * kRowChunk, +kRowChunk) of row b / blocks_per_row.
// Narrow rows (dim <= 2 * kRowThreads): block b handles rows_per_block whole
// rows, ceil(dim / 4) threads each. 4 elements per thread; grid-stride over blocks.
template <typename Op>
__global__ void __launch_bounds__(kRowThreads)
    RowwiseKernel(Op op, int64_t n_rows, int64_t dim, int64_t blocks_per_row, int rows_per_block, bool vec) {
  const int64_t total = rows_per_block > 1 ? CeilDiv(n_rows, rows_per_block) : n_rows * blocks_per_row;
  const int64_t chunks = CeilDiv(dim, 4);
  for (int64_t b = blockIdx.x; b < total; b += gridDim.x) {
    int64_t r, i;
    if (rows_per_block > 1) {
      const int64_t slot = threadIdx.x / chunks;
      if (slot >= rows_per_block) continue;
      r = b * rows_per_block + slot;
      i = (threadIdx.x % chunks) * 4;
      if (r >= n_rows) continue;
    } else {
      r = b / blocks_per_row;
      i = (b % blocks_per_row) * kRowChunk + static_cast<int64_t>(threadIdx.x) * 4;
    }
    if (i < dim) op.Apply(r, i, static_cast<int>(Min<int64_t>(4, dim - i)), vec);
  }
}

template <typename Op>
int LaunchRowwise(const Op& op, int64_t n_rows, int64_t dim, bool vec, const CudaLaunchContext& ctx) {
  if (n_rows == 0 || dim == 0) return kKernelOk;
  const int64_t chunks = CeilDiv(dim, 4);
  const int rows_per_block = chunks * 2 <= kRowThreads ? static_cast<int>(kRowThreads / chunks) : 1;
  const int64_t blocks_per_row = CeilDiv(dim, kRowChunk);
  const int64_t total = rows_per_block > 1 ? CeilDiv(n_rows, rows_per_block) : n_rows * blocks_per_row;
  const int64_t blocks = Min<int64_t>(total, kMaxGridBlocks);
  return LaunchStatus(Launch(RowwiseKernel<Op>, dim3(static_cast<unsigned int>(blocks)), dim3(kRowThreads), 0,
                             ctx.stream, op, n_rows, dim, blocks_per_row, rows_per_block, vec));
}

// ---------------------------------------------------------------- Rope

constexpr int kRopeThreads = 128;
constexpr int kRopeTile = 256;      // cos/sin pairs staged in shared memory at a time
constexpr int kRopeArgFreqs = 256;  // inverse frequencies passed by value (rotary_dim <= 512)

struct RopeArgs {
  float* x;
  const int64_t* positions;
  int64_t start_pos;
  int64_t n_tokens;
  int64_t n_heads;
  int64_t head_dim;
  int64_t half;
  int64_t x_stride;
  double theta;
  // inv_freq[i] = theta^(-2i / rotary_dim), computed on the host as the CPU
  // does, when half <= kRopeArgFreqs; otherwise the device computes them.
  bool host_freqs;
  double inv_freq[kRopeArgFreqs];
};

__device__ __forceinline__ float RotLo(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x1, c), -__fmul_rn(x2, s));
}
__device__ __forceinline__ float RotHi(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One block per token (grid-stride): stages cos/sin of a tile of frequencies
// in shared memory, then rotates that tile of every head.
__global__ void __launch_bounds__(kRopeThreads) RopeKernel(RopeArgs a) {
  __shared__ float cos_s[kRopeTile];
  __shared__ float sin_s[kRopeTile];
  for (int64_t t = blockIdx.x; t < a.n_tokens; t += gridDim.x) {
    const double pos = static_cast<double>(a.positions != nullptr ? a.positions[t] : a.start_pos + t);
    float* xt = a.x + t * a.x_stride;
    for (int64_t i0 = 0; i0 < a.half; i0 += kRopeTile) {
      const int tile = static_cast<int>(Min<int64_t>(kRopeTile, a.half - i0));
      for (int j = threadIdx.x; j < tile; j += blockDim.x) {
        const int64_t i = i0 + j;
        const double inv_freq = a.host_freqs
                                    ? a.inv_freq[i]
                                    : pow(a.theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * a.half));
        const double angle = pos * inv_freq;
        cos_s[j] = static_cast<float>(cos(angle));
        sin_s[j] = static_cast<float>(sin(angle));
      }
      __syncthreads();
      const int64_t pairs = a.n_heads * tile;
      for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int64_t h = p / tile;
        const int j = static_cast<int>(p % tile);
        float* xh = xt + h * a.head_dim + i0;
        const float x1 = xh[j];
        const float x2 = xh[j + a.half];
        xh[j] = RotLo(x1, x2, cos_s[j], sin_s[j]);
        xh[j + a.half] = RotHi(x1, x2, cos_s[j], sin_s[j]);
      }
      __syncthreads();  // the tile is rewritten next
    }
  }
}

}  // namespace

int Embedding(const EmbeddingParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckEmbeddingParams(p); status != kKernelOk) return status;
  EmbeddingArgs a{};
  a.table = p.table;
  a.table_bf16 = p.table_bf16;
  a.tokens = p.tokens;
  a.out = p.out;
  a.n_tokens = p.n_tokens;
  a.vocab = p.vocab;
  a.dim = p.dim;
  a.vec = p.dim % 4 == 0 && Aligned16(p.out) &&
          (p.table != nullptr ? Aligned16(p.table) : (reinterpret_cast<uintptr_t>(p.table_bf16) & 7u) == 0);
  a.error_flag = ctx.error_flag;
  const int64_t blocks = Min<int64_t>(p.n_tokens, kMaxGridBlocks);
  return LaunchStatus(
      Launch(EmbeddingKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kEmbeddingThreads), 0, ctx.stream, a));
}

int RmsNorm(const RmsNormParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckRmsNormParams(p); status != kKernelOk) return status;
  NormArgs a{};
  a.x = p.x;
  a.z = nullptr;
  a.weight = p.weight;
  a.out = p.out;
  a.n_rows = p.n_rows;
  a.dim = p.dim;
  a.group_size = p.dim;
  a.groups = 1;
  a.x_stride = p.x_row_stride ? p.x_row_stride : p.dim;
  a.z_stride = 0;
  a.out_stride = p.out_row_stride ? p.out_row_stride : p.dim;
  a.eps = p.eps;
  a.mode = NormMode::kPlain;
  return LaunchNorm(a, ctx);
}

int GatedRmsNorm(const GatedRmsNormParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckGatedRmsNormParams(p); status != kKernelOk) return status;
  const int64_t gs = p.group_size ? p.group_size : p.dim;
  NormArgs a{};
  a.x = p.x;
  a.z = p.z;
  a.weight = p.weight;
  a.out = p.out;
  a.n_rows = p.n_rows;
  a.dim = p.dim;
  a.group_size = gs;
  a.groups = p.dim / gs;
  a.x_stride = p.x_row_stride ? p.x_row_stride : p.dim;
  a.z_stride = p.z_row_stride ? p.z_row_stride : p.dim;
  a.out_stride = p.out_row_stride ? p.out_row_stride : p.dim;
  a.eps = p.eps;
  a.mode = p.z == nullptr ? NormMode::kPlain : (p.norm_before_gate ? NormMode::kNormFirst : NormMode::kGateFirst);
  return LaunchNorm(a, ctx);
}

int Activation(const ActivationParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckActivationParams(p); status != kKernelOk) return status;
  ActivationOp op{};
  op.x = p.x;
  op.out = p.out;
  op.xs = p.x_row_stride ? p.x_row_stride : p.dim;
  op.os = p.out_row_stride ? p.out_row_stride : p.dim;
  op.kind = p.kind;
  op.alpha = p.alpha;
  const bool vec = p.dim % 4 == 0 && Aligned16(op.x) && op.xs % 4 == 0 && Aligned16(op.out) && op.os % 4 == 0;
  return LaunchRowwise(op, p.n_rows, p.dim, vec, ctx);
}

int SwiGlu(const SwiGluParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckSwiGluParams(p); status != kKernelOk) return status;
  SwiGluOp op{};
  op.gate = p.gate;
  op.up = p.up;
  op.out = p.out;
  op.gs = p.gate_row_stride ? p.gate_row_stride : p.dim;
  op.us = p.up_row_stride ? p.up_row_stride : p.dim;
  op.os = p.out_row_stride ? p.out_row_stride : p.dim;
  op.act = p.gate_activation;
  const bool vec = p.dim % 4 == 0 && Aligned16(op.gate) && op.gs % 4 == 0 && Aligned16(op.up) && op.us % 4 == 0 &&
                   Aligned16(op.out) && op.os % 4 == 0;
  return LaunchRowwise(op, p.n_rows, p.dim, vec, ctx);
}

int DtSoftplus(const DtSoftplusParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckDtSoftplusParams(p); status != kKernelOk) return status;
  DtSoftplusOp op{};
  op.raw = p.dt_raw;
  op.bias = p.dt_bias;
  op.dt = p.dt;
  op.rs = p.dt_raw_row_stride ? p.dt_raw_row_stride : p.n_heads;
  op.ds = p.dt_row_stride ? p.dt_row_stride : p.n_heads;
  op.dt_min = p.dt_min;
  op.dt_max = p.dt_max;
  const bool vec = p.n_heads % 4 == 0 && Aligned16(op.raw) && op.rs % 4 == 0 && Aligned16(op.dt) && op.ds % 4 == 0 &&
                   (op.bias == nullptr || Aligned16(op.bias));
  return LaunchRowwise(op, p.n_tokens, p.n_heads, vec, ctx);
}

int Rope(const RopeParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckRopeParams(p); status != kKernelOk) return status;
  const int64_t rot = p.rotary_dim ? p.rotary_dim : p.head_dim;
  if (p.n_tokens == 0) return kKernelOk;
  RopeArgs a{};
  a.x = p.x;
  a.positions = p.positions;
  a.start_pos = p.start_pos;
  a.n_tokens = p.n_tokens;
  a.n_heads = p.n_heads;
  a.head_dim = p.head_dim;
  a.half = rot / 2;
  a.x_stride = p.x_token_stride ? p.x_token_stride : p.n_heads * p.head_dim;
  a.theta = p.theta;
  a.host_freqs = a.half <= kRopeArgFreqs;
  if (a.host_freqs) {
    for (int64_t i = 0; i < a.half; ++i) {
      a.inv_freq[i] = std::pow(p.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
    }
  }
  const int64_t blocks = Min<int64_t>(p.n_tokens, kMaxGridBlocks);
  return LaunchStatus(
      Launch(RopeKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kRopeThreads), 0, ctx.stream, a));
}

int GatherRows(const GatherRowsParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckGatherRowsParams(p); status != kKernelOk) return status;
  GatherRowsOp op{};
  op.x = p.x;
  op.index = p.index;
  op.out = p.out;
  op.xs = p.x_row_stride ? p.x_row_stride : p.dim;
  op.os = p.out_row_stride ? p.out_row_stride : p.dim;
  const bool vec = p.dim % 4 == 0 && Aligned16(op.x) && op.xs % 4 == 0 && Aligned16(op.out) && op.os % 4 == 0;
  return LaunchRowwise(op, p.n_rows, p.dim, vec, ctx);
}

int ScatterAddRows(const ScatterAddRowsParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckScatterAddRowsParams(p); status != kKernelOk) return status;
  ScatterAddRowsOp op{};
  op.x = p.x;
  op.index = p.index;
  op.weight = p.weight;
  op.out = p.out;
  op.xs = p.x_row_stride ? p.x_row_stride : p.dim;
  op.os = p.out_row_stride ? p.out_row_stride : p.dim;
  op.alpha = p.alpha;
  const bool vec = p.dim % 4 == 0 && Aligned16(op.x) && op.xs % 4 == 0 && Aligned16(op.out) && op.os % 4 == 0;
  return LaunchRowwise(op, p.n_rows, p.dim, vec, ctx);
}

int MoeCombine(const MoeCombineParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckMoeCombineParams(p); status != kKernelOk) return status;
  if (p.per_row == 0) return kKernelOk;
  MoeCombineOp op{};
  op.x = p.x;
  op.slots = p.slots;
  op.weights = p.weights;
  op.out = p.out;
  op.xs = p.x_row_stride ? p.x_row_stride : p.dim;
  op.os = p.out_row_stride ? p.out_row_stride : p.dim;
  op.per_row = p.per_row;
  const bool vec = p.dim % 4 == 0 && Aligned16(op.x) && op.xs % 4 == 0 && Aligned16(op.out) && op.os % 4 == 0;
  return LaunchRowwise(op, p.n_rows, p.dim, vec, ctx);
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
