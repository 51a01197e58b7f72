// Mamba2 SSD kernels on CUDA: the chunk scan (prefill) and the selective state
// update (decode). See kernels/ssd_params.h for the math and the contracts.
//
// Numerics, shared by every tiling: each output is one fixed sequence of fp32
// operations (fmaf chains in ascending index order), so the bits depend on the
// inputs and on the state at the start of the block only, never on the tile
// sizes, the thread count, the slice of head_dim a thread block owns, the batch
// or where a call started.

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

// ---------------------------------------------------------------------------
// SsdChunkScan.
//
// Grid: one thread block per (head, slice of kScanSlice head_dim rows); it walks
// the sequence block by block (blocks of `block_size` tokens on the absolute
// grid; a block never straddles a chunk boundary), carrying its slice of the
// state [rows, d_state] in shared memory. For a block of L tokens of head h,
// with S_t = sum_{k<=t} dt_k * A (sequential fmaf from the block start):
//   y_t[p]   = fmaf(exp(S_t), sum_n C_t[n] st[p, n],                 (n ascending)
//                   sum_{s<=t} mix[t, s] x_s[p])                      (s ascending)
//              then fmaf(D, x_t[p], y)
//   mix[t,s] = ((sum_n C_t[n] B_s[n]) * exp(S_t - S_s)) * dt_s       (n ascending)
//   st'[p,n] = fmaf(exp(S_last), st[p,n],
//                   sum_s B_s[n] * ((exp(S_last - S_s) * dt_s) * x_s[p]))  (s ascending)
// The block is processed in tiles of `tt` tokens (output tiles i, and for each
// the source tiles j <= i), only to bound shared memory; a partial sum lives in
// one thread across tiles, so the tiling does not change any bit.
//
// Work per tile pair, 256 threads, register-tiled products over shared memory
// (TileFma): C.B^T as 16 x 16 threads of 4 x 4 outputs (the whole tt x tt
// square; entries above the diagonal are dropped), the inter and intra terms
// of y as 32 x 8 threads of 2 x 2 (t, p) outputs, and the state accumulation
// as 8 x 32 threads of 2 x 4 (p, n) outputs per 128 of d_state. Shared-memory
// rows of d_state length have an odd stride, so the rows a warp reads fall in
// distinct banks. C.B^T is recomputed by each slice of each head of a group
// (at head_dim 64, 4 slices per head); see the launcher for the budget.
// ---------------------------------------------------------------------------

constexpr int kScanThreads = 256;
constexpr int kScanSlice = 16;    // head_dim rows per thread block
constexpr int kScanMaxTile = 64;  // tokens per tile
// GPU default block length: gcd(chunk_size, 64). 64 tokens is one tile (no
// source tile is reloaded) and keeps the quadratic C.B^T work (L d_state per
// token and slice) at most the size of the two state products (2 rows d_state
// per token and slice, rows = 16).
constexpr int64_t kDefaultBlock = 64;
// Dynamic shared memory budget per block (below sm_80's 163 KiB opt-in
// limit), lowered to the device's own opt-in limit where that is smaller
// (ScanSmemBudget): sm_86 and sm_89 run the sm_80 build with 99 KiB.
constexpr int64_t kScanMaxSmemBytes = 160 * 1024;

struct ScanArgs {
  const float* x;
  const float* dt;
  const float* A;
  const float* B;
  const float* C;
  const float* D;
  const float* initial_state;
  float* y;
  float* final_state;
  float* chunk_states;
  int64_t seqlen;
  int64_t n_heads;
  int64_t head_dim;
  int64_t d_state;
  int64_t heads_per_group;
  int64_t chunk_size;
  int64_t start_pos;
  int64_t block;
  int64_t x_stride;
  int64_t dt_stride;
  int64_t bc_stride;
  int64_t y_stride;
  int64_t n_slices;
  int rows;  // head_dim rows per slice
  int tt;    // tile length (tokens)
  int ldn;   // row stride of d_state arrays in shared memory (odd: no bank conflicts)
};

struct ScanLayout {
  int64_t st, sacc, bt, ct, mix, xs, wx, dt_t, cum_t, dt_s, cum_s, scal, total;  // offsets in floats
};

__host__ __device__ inline ScanLayout MakeScanLayout(int rows, int tt, int ldn) {
  ScanLayout l;
  int64_t o = 0;
  l.st = o;
  o += static_cast<int64_t>(rows) * ldn;
  l.sacc = o;
  o += static_cast<int64_t>(rows) * ldn;
  l.bt = o;
  o += static_cast<int64_t>(tt) * ldn;
  l.ct = o;
  o += static_cast<int64_t>(tt) * ldn;
  l.mix = o;
  o += static_cast<int64_t>(tt) * (tt | 1);
  l.xs = o;
  o += static_cast<int64_t>(tt) * rows;
  l.wx = o;
  o += static_cast<int64_t>(tt) * rows;
  l.dt_t = o;
  o += tt;
  l.cum_t = o;
  o += tt;
  l.dt_s = o;
  o += tt;
  l.cum_s = o;
  o += tt;
  l.scal = o;
  o += 4;
  l.total = o;
  return l;
}

// Register-tiled products over shared memory. acc[i][j] = fmaf(A(m_i, k),
// B(n_j, k), acc[i][j]) for k = 0, 1, ..., K - 1 in that order, with
// m_i = m0 + i * dm, n_j = n0 + j * dn, A(m, k) = a[m * am + k * ak] and
// B(n, k) = b[n * bn + k * bk]: each output is the same fmaf chain as a plain
// loop, whatever the tiling. Rows m_i >= M (columns n_j >= Nn) read row 0
// instead: their outputs are garbage the caller never stores. kCausal: only
// the terms k <= m_i + causal_offset.
template <int RM, int RN, bool kCausal>
__device__ __forceinline__ void TileFma(const float* a, int am, int ak, int m0, int dm, int M, const float* b, int bn,
                                        int bk, int n0, int dn, int Nn, int K, int causal_offset,
                                        float (&acc)[RM][RN]) {
  int ao[RM], bo[RN];  // row offsets (32-bit: shared memory)
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int m = m0 + i * dm;
    ao[i] = (m < M ? m : 0) * am;
  }
#pragma unroll
  for (int j = 0; j < RN; ++j) {
    const int n = n0 + j * dn;
    bo[j] = (n < Nn ? n : 0) * bn;
  }
  for (int k = 0; k < K; ++k) {
    float av[RM], bv[RN];
#pragma unroll
    for (int i = 0; i < RM; ++i) av[i] = a[ao[i] + k * ak];
#pragma unroll
    for (int j = 0; j < RN; ++j) bv[j] = b[bo[j] + k * bk];
#pragma unroll
    for (int i = 0; i < RM; ++i) {
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        if (!kCausal || k <= m0 + i * dm + causal_offset) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
  }
}

// Loads dt of tokens [t0, t0 + n) of head h into dts[] and their running sums
// from `start` into cums[] (cums[k] = fmaf(dt_k, A, cums[k-1])): every thread
// k < n repeats the sequential sum, so each value has the bits of one
// sequential pass. Ends with a barrier.
__device__ inline void LoadDtAndCum(const ScanArgs& a, int64_t h, float A, int64_t t0, int n, float start, float* dts,
                                    float* cums) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) dts[k] = a.dt[(t0 + k) * a.dt_stride + h];
  __syncthreads();
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    float c = start;
    for (int i = 0; i <= k; ++i) c = fmaf(dts[i], A, c);
    cums[k] = c;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kScanThreads, 2) ChunkScanKernel(ScanArgs a) {
  const int N = static_cast<int>(a.d_state);  // <= 2^24 (checked by the launcher)
  const int ldn = a.ldn;
  const int tt = a.tt;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;             // kScanThreads: the layouts below assume it
  const int tp_t = tid / 8, tp_p = tid % 8;    // (t, p) layout, 32 x 8
  const int cb_t = tid / 16, cb_s = tid % 16;  // (t, s) layout, 16 x 16
  const int pn_p = tid / 32, pn_n = tid % 32;  // (p, n) layout, 8 x 32
  const int ldm = tt | 1;                      // row stride of mix (odd: no bank conflicts)
  const int64_t h = blockIdx.x / a.n_slices;
  const int64_t p0 = (blockIdx.x % a.n_slices) * a.rows;
  const int np = static_cast<int>(Min<int64_t>(a.rows, a.head_dim - p0));  // rows of this slice
  const int ps = a.rows;                                                   // row stride of xs/wx
  const int64_t g = h / a.heads_per_group;
  const float A = a.A[h];
  const bool has_d = a.D != nullptr;
  const float Dh = has_d ? a.D[h] : 0.0f;
  const int64_t state_elems = static_cast<int64_t>(np) * N;
  const int64_t head_state = (h * a.head_dim + p0) * N;  // this slice in [n_heads, head_dim, d_state]

  HS_DYNAMIC_SMEM(float, smem);
  const ScanLayout l = MakeScanLayout(a.rows, tt, ldn);
  float* st = smem + l.st;
  float* sacc = smem + l.sacc;
  float* bt = smem + l.bt;
  float* ct = smem + l.ct;
  float* mix = smem + l.mix;
  float* xs = smem + l.xs;
  float* wx = smem + l.wx;
  float* dt_t = smem + l.dt_t;
  float* cum_t = smem + l.cum_t;
  float* dt_s = smem + l.dt_s;
  float* cum_s = smem + l.cum_s;
  float* scal = smem + l.scal;

  for (int64_t e = tid; e < state_elems; e += nthreads) {
    const int64_t p = e / N, n = e % N;
    st[p * ldn + n] = a.initial_state != nullptr ? a.initial_state[head_state + e] : 0.0f;
  }
  const float* Bg = a.B + g * N;
  const float* Cg = a.C + g * N;
  const float* xh = a.x + h * a.head_dim + p0;

  int64_t t0 = 0;
  while (t0 < a.seqlen) {
    const int64_t abs = a.start_pos + t0;
    const int64_t len = Min<int64_t>(a.seqlen - t0, (abs / a.block + 1) * a.block - abs);
    if (tid == 0) {
      float c = 0.0f;
      for (int64_t k = 0; k < len; ++k) c = fmaf(a.dt[(t0 + k) * a.dt_stride + h], A, c);
      scal[0] = c;
    }
    for (int64_t e = tid; e < state_elems; e += nthreads) sacc[(e / N) * ldn + e % N] = 0.0f;
    __syncthreads();
    const float cum_last = scal[0];

    float t_start = 0.0f;  // S just before output tile i
    for (int64_t i0 = 0; i0 < len; i0 += tt) {
      const int ti = static_cast<int>(Min<int64_t>(tt, len - i0));
      for (int64_t e = tid; e < static_cast<int64_t>(ti) * N; e += nthreads) {
        const int64_t r = e / N, n = e % N;
        ct[r * ldn + n] = Cg[(t0 + i0 + r) * a.bc_stride + n];
      }
      LoadDtAndCum(a, h, A, t0 + i0, ti, t_start, dt_t, cum_t);

      // Inter-block term C_t . st[p] and the intra-block accumulators, over
      // the (t, p) layout: 32 x 8 threads, each 2 x 2 outputs (t = tp_t + 32 i,
      // p = tp_p + 8 j).
      float inter[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      float intra[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      TileFma<2, 2, false>(ct, ldn, 1, tp_t, 32, ti, st, ldn, 1, tp_p, 8, np, N, 0, inter);

      float s_start = 0.0f;  // S just before source tile j
      for (int64_t j0 = 0; j0 <= i0; j0 += tt) {
        const int sj = static_cast<int>(Min<int64_t>(tt, len - j0));
        const bool diag = j0 == i0;
        __syncthreads();  // the previous tile's readers of bt, xs, mix, wx, dt_s, cum_s are done
        for (int64_t e = tid; e < static_cast<int64_t>(sj) * N; e += nthreads) {
          const int64_t r = e / N, n = e % N;
          bt[r * ldn + n] = Bg[(t0 + j0 + r) * a.bc_stride + n];
        }
        for (int e = tid; e < sj * np; e += nthreads) {
          const int r = e / np, p = e % np;
          xs[r * ps + p] = xh[(t0 + j0 + r) * a.x_stride + p];
        }
        LoadDtAndCum(a, h, A, t0 + j0, sj, s_start, dt_s, cum_s);

        // mix[t, s] for t in tile i, s in tile j (zero above the diagonal),
        // over 16 x 16 threads, each 4 x 4 (t = cb_t + 16 i, s = cb_s + 16 j).
        {
          float cb[4][4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) cb[i][j] = 0.0f;
          }
          TileFma<4, 4, false>(ct, ldn, 1, cb_t, 16, ti, bt, ldn, 1, cb_s, 16, sj, N, 0, cb);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int t = cb_t + 16 * i, s = cb_s + 16 * j;
              if (t < ti && s < sj) {
                mix[t * ldm + s] = j0 + s <= i0 + t ? (cb[i][j] * expf(cum_t[t] - cum_s[s])) * dt_s[s] : 0.0f;
              }
            }
          }
        }
        if (diag) {
          // Decay-weighted x of this tile for the state update (tile i is its last reader).
          for (int e = tid; e < sj * np; e += nthreads) {
            const int r = e / np, p = e % np;
            wx[r * ps + p] = (expf(cum_last - cum_s[r]) * dt_s[r]) * xs[r * ps + p];
          }
        }
        __syncthreads();

        if (diag) {
          TileFma<2, 2, true>(mix, ldm, 1, tp_t, 32, ti, xs, 1, ps, tp_p, 8, np, sj, 0, intra);
          // State accumulator over the (p, n) layout: 8 x 32 threads, each 2 x 4
          // (p = pn_p + 8 i, n = nb + pn_n + 32 j), d_state in pieces of 128.
          for (int nb = 0; nb < N; nb += 128) {
            float acc[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const int p = pn_p + 8 * i, n = nb + pn_n + 32 * j;
                acc[i][j] = p < np && n < N ? sacc[p * ldn + n] : 0.0f;
              }
            }
            TileFma<2, 4, false>(wx, 1, ps, pn_p, 8, np, bt + nb, 1, ldn, pn_n, 32, N - nb, sj, 0, acc);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const int p = pn_p + 8 * i, n = nb + pn_n + 32 * j;
                if (p < np && n < N) sacc[p * ldn + n] = acc[i][j];
              }
            }
          }
        } else {
          TileFma<2, 2, false>(mix, ldm, 1, tp_t, 32, ti, xs, 1, ps, tp_p, 8, np, sj, 0, intra);
        }
        s_start = cum_s[sj - 1];
      }

#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = tp_t + 32 * i, p = tp_p + 8 * j;
          if (t < ti && p < np) {
            const int64_t tok = t0 + i0 + t;
            float v = fmaf(expf(cum_t[t]), inter[i][j], intra[i][j]);
            if (has_d) v = fmaf(Dh, xh[tok * a.x_stride + p], v);
            a.y[tok * a.y_stride + h * a.head_dim + p0 + p] = v;
          }
        }
      }
      t_start = cum_t[ti - 1];
      __syncthreads();  // ct, dt_t, cum_t are reloaded by the next tile
    }

    const float decay = expf(cum_last);
    for (int64_t e = tid; e < state_elems; e += nthreads) {
      const int64_t idx = (e / N) * ldn + e % N;
      st[idx] = fmaf(decay, st[idx], sacc[idx]);
    }
    t0 += len;
    const int64_t pos = a.start_pos + t0;
    if (a.chunk_states != nullptr && pos % a.chunk_size == 0) {
      const int64_t row = pos / a.chunk_size - a.start_pos / a.chunk_size - 1;
      float* dst = a.chunk_states + row * a.n_heads * a.head_dim * N + head_state;
      for (int64_t e = tid; e < state_elems; e += nthreads) dst[e] = st[(e / N) * ldn + e % N];
    }
    __syncthreads();
  }
  if (a.final_state != nullptr) {
    for (int64_t e = tid; e < state_elems; e += nthreads) a.final_state[head_state + e] = st[(e / N) * ldn + e % N];
  }
}

// ---------------------------------------------------------------------------
// SelectiveStateUpdate.
//
// One thread block (kSsuWarps warps) per (batch row, head, slice of kSsuRows
// head_dim rows); each warp owns kSsuRowsPerWarp rows, and lane l owns the
// state elements n = 128 q + 4 l + {0..3} (q = 0, 1, ...) of each of them,
// loaded and stored as 16-byte vectors where alignment allows (the arithmetic
// is the same either way). Per row and lane: s = fmaf(dt x_p, B_n, s * dA),
// partial = fmaf(s, C_n, partial) in ascending n; then WarpSum (a fixed
// butterfly): y's bits do not depend on the batch, the slot or the alignment.
// ---------------------------------------------------------------------------

constexpr int kSsuWarps = 4;
constexpr int kSsuRowsPerWarp = 4;
constexpr int kSsuRows = kSsuWarps * kSsuRowsPerWarp;

struct alignas(16) Float4 {
  float v[4];
};

struct SsuArgs {
  float* state;
  const int32_t* state_slots;
  const float* x;
  const float* dt;
  const float* A;
  const float* B;
  const float* C;
  const float* D;
  const float* z;
  float* y;
  int32_t* error_flag;
  int64_t num_slots;
  int64_t n_heads;
  int64_t head_dim;
  int64_t d_state;
  int64_t heads_per_group;
  int64_t x_stride;
  int64_t dt_stride;
  int64_t bc_stride;
  int64_t z_stride;
  int64_t y_stride;
  int64_t n_slices;
  bool vec;  // state, B and C rows are 16-byte aligned and d_state % 4 == 0
};

__device__ __forceinline__ void Load4(const float* p, int64_t n0, int64_t N, bool vec, float out[4]) {
  if (vec && n0 + 4 <= N) {
    const Float4 f = *reinterpret_cast<const Float4*>(p + n0);
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = f.v[k];
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = n0 + k < N ? p[n0 + k] : 0.0f;
  }
}

__global__ void __launch_bounds__(kSsuWarps * 32) StateUpdateKernel(SsuArgs a, int64_t block_offset) {
  const int64_t i = block_offset + blockIdx.x;
  const int64_t slice = i % a.n_slices;
  const int64_t h = (i / a.n_slices) % a.n_heads;
  const int64_t b = i / (a.n_slices * a.n_heads);
  const int64_t slot = a.state_slots != nullptr ? a.state_slots[b] : b;
  if (slot < 0) return;  // padding row
  if (slot >= a.num_slots) {
    if (threadIdx.x == 0 && slice == 0) ReportBadIndex(a.error_flag);
    return;
  }
  const int64_t N = a.d_state;
  const int64_t g = h / a.heads_per_group;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float dtv = a.dt[b * a.dt_stride + h];
  const float dA = expf(dtv * a.A[h]);
  const float* Bg = a.B + b * a.bc_stride + g * N;
  const float* Cg = a.C + b * a.bc_stride + g * N;
  const float* xr = a.x + b * a.x_stride + h * a.head_dim;
  const int64_t p_first = slice * kSsuRows + warp * kSsuRowsPerWarp;

  float u[kSsuRowsPerWarp];
  float part[kSsuRowsPerWarp];
  float* rows[kSsuRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kSsuRowsPerWarp; ++r) {
    const int64_t p = p_first + r;
    const bool valid = p < a.head_dim;
    u[r] = valid ? dtv * xr[p] : 0.0f;
    part[r] = 0.0f;
    rows[r] = valid ? a.state + ((slot * a.n_heads + h) * a.head_dim + p) * N : nullptr;
  }
  for (int64_t n0 = 4 * lane; n0 < N; n0 += 128) {
    const int cnt = static_cast<int>(Min<int64_t>(4, N - n0));
    // All loads of the step first (B, C and the rows' state): several 16-byte
    // requests in flight per thread.
    float bv[4], cv[4], s[kSsuRowsPerWarp][4];
    Load4(Bg, n0, N, a.vec, bv);
    Load4(Cg, n0, N, a.vec, cv);
#pragma unroll
    for (int r = 0; r < kSsuRowsPerWarp; ++r) {
      if (rows[r] != nullptr) Load4(rows[r], n0, N, a.vec, s[r]);
    }
#pragma unroll
    for (int r = 0; r < kSsuRowsPerWarp; ++r) {
      if (rows[r] == nullptr) continue;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k < cnt) {
          s[r][k] = fmaf(u[r], bv[k], s[r][k] * dA);
          part[r] = fmaf(s[r][k], cv[k], part[r]);
        }
      }
      if (a.vec && cnt == 4) {
        Float4 f;
#pragma unroll
        for (int k = 0; k < 4; ++k) f.v[k] = s[r][k];
        *reinterpret_cast<Float4*>(rows[r] + n0) = f;
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (k < cnt) rows[r][n0 + k] = s[r][k];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kSsuRowsPerWarp; ++r) {
    const float sum = WarpSum(part[r]);
    const int64_t p = p_first + r;
    if (lane == 0 && p < a.head_dim) {
      float out = sum;
      if (a.D != nullptr) out = fmaf(a.D[h], xr[p], out);
      if (a.z != nullptr) {
        const float zv = a.z[b * a.z_stride + h * a.head_dim + p];
        out = out * (zv / (1.0f + expf(-zv)));
      }
      a.y[b * a.y_stride + h * a.head_dim + p] = out;
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// kScanMaxSmemBytes, or the current device's opt-in limit of dynamic shared
// memory per block where that is smaller (never below the 48 KiB every
// device grants). The tile and slice sizes follow from it; the bits do not.
int64_t ScanSmemBudget() {
  int device = 0;
  int optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // not sticky: fall back to the limit every device has
    optin = 48 * 1024;
  }
  return Min<int64_t>(kScanMaxSmemBytes, Max<int64_t>(optin, 48 * 1024));
}

int64_t Gcd(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

}  // namespace

int SsdChunkScan(const SsdChunkScanParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckSsdChunkScanParams(p); status != kKernelOk) return status;
  // The block size is checked as the CPU's (kernels/cpu/ssd_chunk_scan.cc), with this backend's default.
  if (p.block_size < 0) return kKernelInvalidArgument;
  const int64_t block = p.block_size == 0 ? Gcd(p.chunk_size, kDefaultBlock) : p.block_size;
  if (p.chunk_size % block != 0) return kKernelInvalidArgument;
  if (p.seqlen == 0 && (p.final_state == nullptr || p.final_state == p.initial_state)) return kKernelOk;

  // Tile and slice sizes: the largest that fit the shared-memory budget.
  int rows = static_cast<int>(Min<int64_t>(kScanSlice, p.head_dim));
  int tt = static_cast<int>(Min<int64_t>(kScanMaxTile, block));
  const int64_t ldn64 = p.d_state % 2 == 0 ? p.d_state + 1 : p.d_state;
  if (ldn64 > (int64_t{1} << 24)) return kKernelUnsupported;
  const int ldn = static_cast<int>(ldn64);
  const int64_t budget = ScanSmemBudget();
  auto bytes = [&] { return MakeScanLayout(rows, tt, ldn).total * static_cast<int64_t>(sizeof(float)); };
  while (bytes() > budget && (tt > 8 || rows > 1)) {
    if (tt > 8) {
      tt /= 2;
    } else {
      rows = (rows + 1) / 2;
    }
  }
  while (bytes() > budget && tt > 1) tt /= 2;
  // Very large d_state: the state slice and one token's B and C do not fit.
  if (bytes() > budget) return kKernelUnsupported;

  ScanArgs a;
  a.x = p.x;
  a.dt = p.dt;
  a.A = p.A;
  a.B = p.B;
  a.C = p.C;
  a.D = p.D;
  a.initial_state = p.initial_state;
  a.y = p.y;
  a.final_state = p.final_state;
  a.chunk_states = p.chunk_states;
  a.seqlen = p.seqlen;
  a.n_heads = p.n_heads;
  a.head_dim = p.head_dim;
  a.d_state = p.d_state;
  a.heads_per_group = p.n_heads / p.n_groups;
  a.chunk_size = p.chunk_size;
  a.start_pos = p.start_pos;
  a.block = block;
  a.x_stride = p.x_token_stride ? p.x_token_stride : p.n_heads * p.head_dim;
  a.dt_stride = p.dt_token_stride ? p.dt_token_stride : p.n_heads;
  a.bc_stride = p.bc_token_stride ? p.bc_token_stride : p.n_groups * p.d_state;
  a.y_stride = p.y_token_stride ? p.y_token_stride : p.n_heads * p.head_dim;
  a.n_slices = CeilDiv(p.head_dim, rows);
  a.rows = rows;
  a.tt = tt;
  a.ldn = ldn;
  const int64_t blocks = a.n_slices * p.n_heads;
  if (blocks > 0x7fffffff) return kKernelUnsupported;
  const size_t smem = static_cast<size_t>(bytes());
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void*>(&ChunkScanKernel),
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return kKernelDeviceError;
  }
  return LaunchStatus(
      Launch(ChunkScanKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kScanThreads), smem, ctx.stream, a));
}

int SelectiveStateUpdate(const SelectiveStateUpdateParams& p, const CudaLaunchContext& ctx) {
  if (const int status = CheckSelectiveStateUpdateParams(p); status != kKernelOk) return status;
  if (p.batch == 0) return kKernelOk;
  SsuArgs a;
  a.state = p.state;
  a.state_slots = p.state_slots;
  a.x = p.x;
  a.dt = p.dt;
  a.A = p.A;
  a.B = p.B;
  a.C = p.C;
  a.D = p.D;
  a.z = p.z;
  a.y = p.y;
  a.error_flag = ctx.error_flag;
  a.num_slots = p.num_slots;
  a.n_heads = p.n_heads;
  a.head_dim = p.head_dim;
  a.d_state = p.d_state;
  a.heads_per_group = p.n_heads / p.n_groups;
  a.x_stride = p.x_batch_stride ? p.x_batch_stride : p.n_heads * p.head_dim;
  a.dt_stride = p.dt_batch_stride ? p.dt_batch_stride : p.n_heads;
  a.bc_stride = p.bc_batch_stride ? p.bc_batch_stride : p.n_groups * p.d_state;
  a.z_stride = p.z_batch_stride ? p.z_batch_stride : p.n_heads * p.head_dim;
  a.y_stride = p.y_batch_stride ? p.y_batch_stride : p.n_heads * p.head_dim;
  a.n_slices = CeilDiv(p.head_dim, kSsuRows);
  a.vec = p.d_state % 4 == 0 && a.bc_stride % 4 == 0 && Aligned16(p.state) && Aligned16(p.B) && Aligned16(p.C);
  // Launched in pieces of at most 2^31 - 1 blocks (grid.x's limit).
  const int64_t total = p.batch * p.n_heads * a.n_slices;
  constexpr int64_t kMaxGrid = 0x7fffffff;
  for (int64_t offset = 0; offset < total; offset += kMaxGrid) {
    const int64_t n = Min(kMaxGrid, total - offset);
    const cudaError_t err =
        Launch(StateUpdateKernel, dim3(static_cast<unsigned int>(n)), dim3(kSsuWarps * 32), 0, ctx.stream, a, offset);
    if (err != cudaSuccess) return kKernelDeviceError;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
