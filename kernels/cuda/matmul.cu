// out = a @ w^T (+ bias) (+ out) on the GPU; see kernels/matmul_params.h.
//
// MatmulMode::kDeterministic: MatmulRowsKernel below. Each out[i, j] is
//   lane l (0..31) of one warp: acc = 0; for t = 0, 1, ..., ceil(k/256) - 1:
//     for e = 0..7: acc = fmaf(a[i, 256t + 8l + e], w[j, 256t + 8l + e], acc)
//     (elements at or beyond k read as +0.0f on both sides);
//   r = WarpSum(acc) (xor butterfly 16, 8, 4, 2, 1; device_common.cuh);
//   r = r + bias[j] if bias; r = out[i, j] + r if accumulate.
// That chain depends on k only: not on m, on the other rows, on the row or
// column tiling, on the grid, on the alignment of the pointers (vector and
// scalar loads fetch the same elements into the same registers) or on the
// weight dtype (bf16 weights are widened exactly, so they give the bits of fp32
// weights holding the widened values). A row's bits depend only on that row of
// a, on w and on bias.
//
// MatmulMode::kFast: cuBLAS on ctx.blas (nvcc build only): fp32 weights by
// cublasSgemm in plain fp32 (the handle's math mode is left as the backend set
// it, CUBLAS_DEFAULT_MATH: no TF32); bf16 weights by cublasGemmEx on bf16 copies
// of the rows of a (rounded to nearest even, in ctx.workspace) with fp32 output
// and CUBLAS_COMPUTE_32F. Bias and accumulate are folded into the output
// first (beta = 1). Rows may differ in the last bits with m. Without a handle,
// in the emulated build, for shapes beyond cuBLAS's int range, or with a
// workspace too small for one bf16 row, kFast runs the deterministic kernel.

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

#if defined(__CUDACC__)
#include <cublas_v2.h>

#include <climits>
#endif

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

// ---- Deterministic kernel ----
//
// Grid/block mapping. A block is W warps (8, or 4 or 2 when that leaves too
// few blocks to fill an H100, see LaunchRows); warp wi computes kColsPerWarp
// adjacent columns (W * kColsPerWarp per block) for a tile of MR rows. The grid
// is linear over (column block, row tile) with the row tile fastest, so the
// blocks that share a column block's weights run close together in time and
// the weights come from DRAM about once per call (the rest from L2); with
// m <= MR (decode: MR is the smallest of 1, 2, 4, 8, 16 that covers m) there
// is one row tile and each weight element is loaded from global memory once.
//
// Per block, the MR rows of a are staged in shared memory `stage` k at a time
// (zero-padded past k and past m); every warp then streams its weight rows,
// 256 elements of k per step (16-byte loads: 8 elements per lane, one load for
// bf16, two for fp32), holds them in registers and runs them against each of
// the MR staged rows. The next step's weights are loaded before the current
// step is computed (one step of prefetch per warp).
//
// Shared memory: MR * stage floats, stage = min(ceil(k / 256) * 256,
// max(256, 8192 / MR)): at most 32 KiB, under the 48 KiB default. Within a
// staged row, the two 16-byte halves of each 8-element chunk are swapped for
// chunks 4..7 of every 8 (Swizzle), so the 8 lanes of each quarter warp read
// distinct banks.

constexpr int kMaxWarps = 8;
constexpr int kMinWarps = 2;
constexpr int kColsPerWarp = 2;
// Fewer warps per block until the grid has this many blocks: two per SM of an
// H100 (132 SMs), so that small-n decode calls still spread over the GPU.
constexpr int64_t kTargetBlocks = 2 * 132;
constexpr int kChunk = 8;           // k elements per lane per step
constexpr int kStep = 32 * kChunk;  // k elements per warp per step
constexpr int kStageFloats = 8192;  // shared-memory floats of staged a per block (32 KiB)
constexpr int kMaxRowsPerTile = 16;

// 16 bytes from global memory (read-only for the kernel's lifetime), aligned to 16.
__device__ __forceinline__ void LoadGlobal16(const void* p, uint32_t out[4]) {
#if defined(__CUDACC__)
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
#else
  std::memcpy(out, p, 16);
#endif
}

// 4 floats from shared memory, aligned to 16.
__device__ __forceinline__ void LoadShared16(const float* p, float out[4]) {
#if defined(__CUDACC__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
#else
  std::memcpy(out, p, 16);
#endif
}

// Position of staged element e (0 <= e < stage) within its shared-memory row:
// chunk c = e / 8 keeps its 8 slots, its halves swap when bit 2 of c is set.
__device__ __forceinline__ int Swizzle(int e) { return (e & ~7) | ((((e >> 2) ^ (e >> 5)) & 1) << 2) | (e & 3); }

// The raw bits of one lane's 8 weights of one step: fp32 = 8 words, bf16 = 4
// words of two elements each (element 2i in the low half, as in memory).
template <typename WT>
struct WeightChunk {
  static constexpr int kWords = sizeof(WT) * kChunk / 4;
  uint32_t v[kWords];
};

// Lane's chunk of weight row `row` (null: a column past n, zeros) at k offset
// kk; elements at or beyond k are zero. `vec`: the row pointer and kk are
// 16-byte aligned, so full chunks use 16-byte loads.
__device__ __forceinline__ void LoadWeights(const float* row, int64_t kk, int64_t k, bool vec, WeightChunk<float>& c) {
  if (row != nullptr && vec && kk + kChunk <= k) {
    LoadGlobal16(row + kk, c.v);
    LoadGlobal16(row + kk + 4, c.v + 4);
    return;
  }
#pragma unroll
  for (int e = 0; e < kChunk; ++e) c.v[e] = (row != nullptr && kk + e < k) ? __float_as_uint(__ldg(row + kk + e)) : 0u;
}
__device__ __forceinline__ void LoadWeights(const uint16_t* row, int64_t kk, int64_t k, bool vec,
                                            WeightChunk<uint16_t>& c) {
  if (row != nullptr && vec && kk + kChunk <= k) {
    LoadGlobal16(row + kk, c.v);
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) {
    const uint32_t lo = (row != nullptr && kk + 2 * i < k) ? __ldg(row + kk + 2 * i) : 0u;
    const uint32_t hi = (row != nullptr && kk + 2 * i + 1 < k) ? __ldg(row + kk + 2 * i + 1) : 0u;
    c.v[i] = lo | (hi << 16);
  }
}

// Exact widening to fp32.
__device__ __forceinline__ void Widen(const WeightChunk<float>& c, float out[kChunk]) {
#pragma unroll
  for (int e = 0; e < kChunk; ++e) out[e] = __uint_as_float(c.v[e]);
}
__device__ __forceinline__ void Widen(const WeightChunk<uint16_t>& c, float out[kChunk]) {
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) {
    out[2 * i] = __uint_as_float(c.v[i] << 16);
    out[2 * i + 1] = __uint_as_float(c.v[i] & 0xffff0000u);
  }
}

struct RowsArgs {
  const float* a;
  const float* bias;
  float* out;
  int64_t m, n, k, lda, ldw, ldo;
  int64_t row_tiles;  // ceil(m / MR); with offsets, experts * tiles_per_expert
  int64_t blocks;     // row_tiles * ceil(n / columns per block)
  // ExpertMatmul (null offsets: a plain matmul): row tile i is tile
  // i % tiles_per_expert of expert i / tiles_per_expert, whose rows are
  // [offsets[e], offsets[e + 1]) (clamped into [0, rows), at most max_rows)
  // and whose weights start expert_w_stride elements after expert e - 1's.
  const int32_t* offsets;
  int64_t tiles_per_expert;
  int64_t expert_w_stride;
  int64_t rows;
  int64_t max_rows;
  int stage;  // staged k per block pass, a multiple of kStep
  bool vec;   // 16-byte weight loads are aligned (row pointers and ldw)
  bool accumulate;
};

template <int MR, typename WT>
__global__ void __launch_bounds__(kMaxWarps * 32) MatmulRowsKernel(RowsArgs p, const WT* w) {
  HS_DYNAMIC_SMEM(float, a_tile);  // [MR, p.stage], Swizzle within rows
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int steps_per_stage = p.stage / kStep;
  const int64_t steps = CeilDiv(p.k, kStep);
  // Which half of its chunk a lane finds first in a staged row (Swizzle).
  const int half0 = 4 * ((lane >> 2) & 1);

  for (int64_t bid = blockIdx.x; bid < p.blocks; bid += gridDim.x) {
    const int64_t tile = bid % p.row_tiles;
    int64_t row0 = tile * MR;
    int64_t row_end = p.m;
    const WT* wb = w;
    if (p.offsets != nullptr) {
      // Block-uniform: the whole block skips a tile past its expert's rows.
      const int64_t e = tile / p.tiles_per_expert;
      const int64_t first = Min<int64_t>(Max<int64_t>(p.offsets[e], 0), p.rows);
      const int64_t end = Min<int64_t>(Min<int64_t>(Max<int64_t>(p.offsets[e + 1], first), p.rows), first + p.max_rows);
      row0 = first + (tile % p.tiles_per_expert) * MR;
      if (row0 >= end) continue;
      row_end = end;
      wb = w + e * p.expert_w_stride;
    }
    const int64_t col0 = (bid / p.row_tiles) * (blockDim.x / 32 * kColsPerWarp) + warp * kColsPerWarp;
    const WT* wrow[kColsPerWarp];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) wrow[c] = col0 + c < p.n ? wb + (col0 + c) * p.ldw : nullptr;
    const bool warp_active = wrow[0] != nullptr;  // the warp's first column is in range

    float acc[MR][kColsPerWarp];
#pragma unroll
    for (int r = 0; r < MR; ++r) {
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) acc[r][c] = 0.0f;
    }

    WeightChunk<WT> cur[kColsPerWarp];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      if (warp_active && steps > 0) {
        LoadWeights(wrow[c], lane * kChunk, p.k, p.vec, cur[c]);
      } else {
        for (uint32_t& x : cur[c].v) x = 0u;
      }
    }

    for (int64_t t = 0; t < steps; ++t) {
      const int slot = static_cast<int>(t % steps_per_stage);
      if (slot == 0) {
        // Stage rows [row0, row0 + MR) x k [t * kStep, + stage) of a.
        const int64_t k0 = t * kStep;
        __syncthreads();  // every warp is done with the previous stage
#pragma unroll 1
        for (int r = 0; r < MR; ++r) {
          const bool row_ok = row0 + r < row_end;
          const float* arow = p.a + (row0 + r) * p.lda;
          for (int e = threadIdx.x; e < p.stage; e += blockDim.x) {
            a_tile[r * p.stage + Swizzle(e)] = row_ok && k0 + e < p.k ? arow[k0 + e] : 0.0f;
          }
        }
        __syncthreads();
      }
      if (!warp_active) continue;

      const int64_t kk_next = (t + 1) * kStep + lane * kChunk;
      WeightChunk<WT> next[kColsPerWarp];
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) {
        if (t + 1 < steps) {
          LoadWeights(wrow[c], kk_next, p.k, p.vec, next[c]);
        } else {
          for (uint32_t& x : next[c].v) x = 0u;
        }
      }

      float wv[kColsPerWarp][kChunk];
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) Widen(cur[c], wv[c]);
      const float* a_chunk = a_tile + (slot * 32 + lane) * kChunk;
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        float av[kChunk];
        LoadShared16(a_chunk + r * p.stage + half0, av);
        LoadShared16(a_chunk + r * p.stage + (4 - half0), av + 4);
#pragma unroll
        for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
          for (int e = 0; e < kChunk; ++e) acc[r][c] = fmaf(av[e], wv[c][e], acc[r][c]);
        }
      }
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) cur[c] = next[c];
    }

    if (warp_active) {
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        if (row0 + r >= row_end) break;  // warp-uniform
        float* orow = p.out + (row0 + r) * p.ldo;
#pragma unroll
        for (int c = 0; c < kColsPerWarp; ++c) {
          if (wrow[c] == nullptr) continue;  // warp-uniform
          const float sum = WarpSum(acc[r][c]);
          if (lane == 0) {
            float v = sum;
            if (p.bias != nullptr) v = v + p.bias[col0 + c];
            if (p.accumulate) v = orow[col0 + c] + v;
            orow[col0 + c] = v;
          }
        }
      }
    }
  }
}

// The experts of an ExpertMatmul (offsets null: a plain matmul, whose m
// rows start at row 0).
struct ExpertTiles {
  const int32_t* offsets = nullptr;
  int64_t experts = 0;
  int64_t rows = 0;
  int64_t max_rows = 0;
};

template <int MR, typename WT>
int LaunchRows(const MatmulParams& p, const WT* w, int64_t lda, int64_t ldw, int64_t ldo, const CudaLaunchContext& ctx,
               const ExpertTiles& experts) {
  RowsArgs args{};
  args.a = p.a;
  args.bias = p.bias;
  args.out = p.out;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.lda = lda;
  args.ldw = ldw;
  args.ldo = ldo;
  args.row_tiles = CeilDiv(p.m, MR);
  args.offsets = experts.offsets;
  if (experts.offsets != nullptr) {
    args.tiles_per_expert = CeilDiv(experts.max_rows, MR);
    args.row_tiles = experts.experts * args.tiles_per_expert;
    args.expert_w_stride = p.n * ldw;
    args.rows = experts.rows;
    args.max_rows = experts.max_rows;
  }
  int warps = kMaxWarps;
  while (warps > kMinWarps && args.row_tiles * CeilDiv(p.n, warps * kColsPerWarp) < kTargetBlocks) warps /= 2;
  args.blocks = args.row_tiles * CeilDiv(p.n, warps * kColsPerWarp);
  const int64_t k_rounded = Max<int64_t>(CeilDiv(p.k, kStep), 1) * kStep;
  args.stage = static_cast<int>(Min<int64_t>(k_rounded, Max(kStep, kStageFloats / MR)));
  args.vec = reinterpret_cast<uintptr_t>(w) % 16 == 0 && (ldw * static_cast<int64_t>(sizeof(WT))) % 16 == 0;
  args.accumulate = p.accumulate;
  const int64_t grid = Min<int64_t>(args.blocks, int64_t{1} << 30);
  const size_t smem = sizeof(float) * MR * static_cast<size_t>(args.stage);
  return LaunchStatus(Launch(MatmulRowsKernel<MR, WT>, dim3(static_cast<unsigned int>(grid)), dim3(32 * warps), smem,
                             ctx.stream, args, w));
}

// p.m: the rows of the call, or (experts) the most one expert may have.
template <typename WT>
int MatmulRows(const MatmulParams& p, const WT* w, int64_t lda, int64_t ldw, int64_t ldo, const CudaLaunchContext& ctx,
               const ExpertTiles& experts = {}) {
  // Rows per tile: only which rows share a weight load, never the arithmetic.
  if (p.m <= 1) return LaunchRows<1>(p, w, lda, ldw, ldo, ctx, experts);
  if (p.m <= 2) return LaunchRows<2>(p, w, lda, ldw, ldo, ctx, experts);
  if (p.m <= 4) return LaunchRows<4>(p, w, lda, ldw, ldo, ctx, experts);
  if (p.m <= 8) return LaunchRows<8>(p, w, lda, ldw, ldo, ctx, experts);
  return LaunchRows<kMaxRowsPerTile>(p, w, lda, ldw, ldo, ctx, experts);
}

int MatmulDeterministic(const MatmulParams& p, int64_t lda, int64_t ldw, int64_t ldo, const CudaLaunchContext& ctx) {
  if (p.m == 0 || p.n == 0) return kKernelOk;
  return p.w != nullptr ? MatmulRows(p, p.w, lda, ldw, ldo, ctx) : MatmulRows(p, p.w_bf16, lda, ldw, ldo, ctx);
}

#if defined(__CUDACC__)
// ---- cuBLAS path (kFast) ----

constexpr int kElementwiseThreads = 256;

// out[i, j] = bias[j], out[i, j] + bias[j] (accumulate), or 0 (bias null),
// for i < m, j < n.
__global__ void __launch_bounds__(kElementwiseThreads)
    PrepareOutputKernel(float* out, const float* bias, int64_t m, int64_t n, int64_t ldo, bool accumulate) {
  const int64_t total = m * n;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / n;
    const int64_t j = idx % n;
    float* o = out + i * ldo + j;
    if (bias == nullptr) {
      *o = 0.0f;
    } else {
      *o = accumulate ? *o + bias[j] : bias[j];
    }
  }
}

// dst[i, kk] = bf16(a[i, kk]) (nearest even) for i < rows, kk < k; dst rows are k apart.
__global__ void __launch_bounds__(kElementwiseThreads)
    RowsToBf16Kernel(const float* a, int64_t lda, uint16_t* dst, int64_t rows, int64_t k) {
  const int64_t total = rows * k;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / k;
    const int64_t kk = idx % k;
    dst[idx] = FloatToBf16(a[i * lda + kk]);
  }
}

unsigned int ElementwiseGrid(int64_t total) {
  return static_cast<unsigned int>(Max<int64_t>(1, Min<int64_t>(CeilDiv(total, kElementwiseThreads), 65536)));
}

int BlasStatus(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS ? kKernelOk : kKernelDeviceError; }

// Row-major out[m, n] (ldo) = a[m, k] (lda) @ w[n, k]^T (ldw) + beta * out is,
// in cuBLAS's column-major terms, C = op(A) * op(B) + beta * C with
//   C    = the buffer out as column-major [n, m], ldc = ldo   (out^T)
//   A    = the buffer w as column-major [k, n], lda = ldw, op = T  -> op(A) = w    [n, k]
//   B    = the buffer a as column-major [k, m], ldb = lda, op = N  -> op(B) = a^T  [k, m]
// i.e. cuBLAS (m, n, k) = (n, m, k): out^T = w @ a^T.
int MatmulBlas(const MatmulParams& p, int64_t lda, int64_t ldw, int64_t ldo, const CudaLaunchContext& ctx) {
  cublasHandle_t handle = static_cast<cublasHandle_t>(ctx.blas);
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (p.bias != nullptr || (p.k == 0 && !p.accumulate)) {
    // Fold the bias into the output (or zero it when k == 0 leaves nothing else to write).
    const int status =
        LaunchStatus(Launch(PrepareOutputKernel, dim3(ElementwiseGrid(p.m * p.n)), dim3(kElementwiseThreads), 0,
                            ctx.stream, p.out, p.bias, p.m, p.n, ldo, p.accumulate));
    if (status != kKernelOk) return status;
    beta = 1.0f;
  }
  if (p.k == 0) return kKernelOk;
  const float alpha = 1.0f;
  const int n = static_cast<int>(p.n);
  const int k = static_cast<int>(p.k);
  if (p.w != nullptr) {
    return BlasStatus(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(p.m), k, &alpha, p.w,
                                  static_cast<int>(ldw), p.a, static_cast<int>(lda), &beta, p.out,
                                  static_cast<int>(ldo)));
  }
  // bf16 weights: bf16 copies of a, as many rows at a time as the workspace holds
  // (stored [rows, k], so ldb = k). Pieces run in stream order, so reusing the
  // workspace is safe.
  uint16_t* a16 = static_cast<uint16_t*>(ctx.workspace);
  const int64_t rows_per_piece = Min<int64_t>(p.m, ctx.workspace_bytes / (2 * p.k));
  for (int64_t r0 = 0; r0 < p.m; r0 += rows_per_piece) {
    const int64_t rows = Min(rows_per_piece, p.m - r0);
    int status = LaunchStatus(Launch(RowsToBf16Kernel, dim3(ElementwiseGrid(rows * p.k)), dim3(kElementwiseThreads), 0,
                                     ctx.stream, p.a + r0 * lda, lda, a16, rows, p.k));
    if (status != kKernelOk) return status;
    status = BlasStatus(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(rows), k, &alpha, p.w_bf16,
                                     CUDA_R_16BF, static_cast<int>(ldw), a16, CUDA_R_16BF, k, &beta, p.out + r0 * ldo,
                                     CUDA_R_32F, static_cast<int>(ldo), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (status != kKernelOk) return status;
  }
  return kKernelOk;
}

// Whether cuBLAS can take the call: a handle, every size and stride in int,
// and (bf16) a workspace that holds at least one row of a as bf16.
bool BlasCanRun(const MatmulParams& p, int64_t lda, int64_t ldw, int64_t ldo, const CudaLaunchContext& ctx) {
  if (ctx.blas == nullptr) return false;
  for (int64_t v : {p.m, p.n, p.k, lda, ldw, ldo}) {
    if (v > INT_MAX) return false;
  }
  if (p.w_bf16 != nullptr && p.k > 0 && (ctx.workspace == nullptr || ctx.workspace_bytes < 2 * p.k)) return false;
  return true;
}
#endif  // defined(__CUDACC__)

}  // namespace

int Matmul(const MatmulParams& p, MatmulMode mode, const CudaLaunchContext& ctx) {
  if (const int status = CheckMatmulParams(p); status != kKernelOk) return status;
  const int64_t lda = p.lda ? p.lda : p.k;
  const int64_t ldw = p.ldw ? p.ldw : p.k;
  const int64_t ldo = p.ldo ? p.ldo : p.n;
  switch (mode) {
    case MatmulMode::kDeterministic:
      return MatmulDeterministic(p, lda, ldw, ldo, ctx);
    case MatmulMode::kFast:
      if (p.m == 0 || p.n == 0) return kKernelOk;
#if defined(__CUDACC__)
      if (BlasCanRun(p, lda, ldw, ldo, ctx)) return MatmulBlas(p, lda, ldw, ldo, ctx);
#endif
      return MatmulDeterministic(p, lda, ldw, ldo, ctx);
  }
  return kKernelInvalidArgument;
}

// Each expert's rows through the deterministic rows kernel: one launch over
// every (expert, row tile, column block), the tiles past an expert's rows
// skipped on the device. A row's bits are those of Matmul(kDeterministic)
// on its expert's weights (the chain depends on k only).
int ExpertMatmul(const ExpertMatmulParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckExpertMatmulParams(p); status != kKernelOk) return status;
  if (p.max_rows == 0 || p.n == 0) return kKernelOk;
  MatmulParams view;
  view.a = p.a;
  view.w = p.w;
  view.w_bf16 = p.w_bf16;
  view.out = p.out;
  view.m = p.max_rows;
  view.n = p.n;
  view.k = p.k;
  const int64_t lda = p.lda ? p.lda : p.k;
  const int64_t ldw = p.ldw ? p.ldw : p.k;
  const int64_t ldo = p.ldo ? p.ldo : p.n;
  ExpertTiles experts;
  experts.offsets = p.offsets;
  experts.experts = p.experts;
  experts.rows = p.rows;
  experts.max_rows = p.max_rows;
  return p.w != nullptr ? MatmulRows(view, p.w, lda, ldw, ldo, ctx, experts)
                        : MatmulRows(view, p.w_bf16, lda, ldw, ldo, ctx, experts);
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
