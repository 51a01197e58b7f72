// Gated DeltaNet kernels on CUDA (kernels/gated_delta_params.h): the gates,
// the chunked prefill on the absolute chunk grid and the one-token decode step.
// The CPU kernels (kernels/cpu/gated_delta.cc) are the reference; these keep
// the same math with their own fixed fp32 order (explicit fmaf chains in
// ascending index order, fixed warp butterflies), so the bits depend only on
// the inputs, never on the batch, the slot, the grid or where a call started
// on the chunk grid; both builds (nvcc, emulator) run the same operations.

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

constexpr float kL2NormEps = 1e-6f;  // transformers' l2norm

// ---------------------------------------------------------------------------
// Gates: one thread per (token, head).
// ---------------------------------------------------------------------------

constexpr int kGateThreads = 256;

struct GateArgs {
  const float* a;
  const float* b;
  const float* dt_bias;
  const float* a_log;
  float* g;
  float* beta;
  int64_t n_tokens;
  int64_t n_heads;
  int64_t as;
  int64_t bs;
};

__global__ void __launch_bounds__(kGateThreads) GatesKernel(GateArgs a) {
  const int64_t total = a.n_tokens * a.n_heads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / a.n_heads, h = e % a.n_heads;
    const float bv = a.b[t * a.bs + h];
    a.beta[e] = 1.0f / (1.0f + expf(-bv));
    const float x = a.a[t * a.as + h] + a.dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    a.g[e] = -expf(a.a_log[h]) * sp;
  }
}

// One head vector x[0, n) prepared into out (shared memory) by one warp:
// out = x * inv * scale, inv = 1 / sqrt(sum x^2 + eps) when l2norm (the sum
// per lane in ascending index, then the warp butterfly).
__device__ __forceinline__ void PrepareVectorWarp(const float* x, int64_t n, bool l2norm, float scale, float* out) {
  const int lane = threadIdx.x % 32;
  float inv = 1.0f;
  if (l2norm) {
    float ss = 0.0f;
    for (int64_t i = lane; i < n; i += 32) ss = fmaf(x[i], x[i], ss);
    inv = 1.0f / sqrtf(WarpSum(ss) + kL2NormEps);
  }
  for (int64_t i = lane; i < n; i += 32) out[i] = (x[i] * inv) * scale;
}

// ---------------------------------------------------------------------------
// Decode: one block of kDecodeThreads per (batch row, value head, slice of
// kDecodeCols value columns). The block holds its [dk, cols] slice of the
// state in shared memory; thread c < cols owns column c's sums (ascending key
// index), all threads load and store the slice (coalesced rows).
// ---------------------------------------------------------------------------

constexpr int kDecodeThreads = 128;
constexpr int kDecodeCols = 32;

struct DecodeArgs {
  float* state;
  const int32_t* state_slots;
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  float* o;
  int32_t* error_flag;
  int64_t num_slots;
  int64_t n_k_heads;
  int64_t n_v_heads;
  int64_t dk;
  int64_t dv;
  int64_t qs, ks, vs;
  int64_t n_slices;
  bool l2norm;
};

__global__ void __launch_bounds__(kDecodeThreads) DecodeKernel(DecodeArgs a, int64_t block_offset) {
  const int64_t i = block_offset + blockIdx.x;
  const int64_t slice = i % a.n_slices;
  const int64_t h = (i / a.n_slices) % a.n_v_heads;
  const int64_t b = i / (a.n_slices * a.n_v_heads);
  const int64_t slot = a.state_slots != nullptr ? a.state_slots[b] : b;
  if (slot < 0) return;  // padding row: nothing read or written
  if (slot >= a.num_slots) {
    if (threadIdx.x == 0 && slice == 0 && h == 0) ReportBadIndex(a.error_flag);
    return;
  }
  const int64_t dk = a.dk, dv = a.dv;
  const int64_t kh = h / (a.n_v_heads / a.n_k_heads);
  const int64_t c0 = slice * kDecodeCols;
  const int cols = static_cast<int>(Min<int64_t>(kDecodeCols, dv - c0));
  HS_DYNAMIC_SMEM(float, smem);
  float* qn = smem;                      // [dk]
  float* kn = qn + dk;                   // [dk]
  float* st = kn + dk;                   // [dk, kDecodeCols]
  float* delta = st + dk * kDecodeCols;  // [kDecodeCols]
  const int warp = threadIdx.x / 32;
  if (warp == 0) PrepareVectorWarp(a.q + b * a.qs + kh * dk, dk, a.l2norm, 1.0f / sqrtf(static_cast<float>(dk)), qn);
  if (warp == 1) PrepareVectorWarp(a.k + b * a.ks + kh * dk, dk, a.l2norm, 1.0f, kn);
  const float decay = expf(a.g[b * a.n_v_heads + h]);
  float* s = a.state + (slot * a.n_v_heads + h) * dk * dv + c0;
  for (int64_t e = threadIdx.x; e < dk * kDecodeCols; e += blockDim.x) {
    const int64_t x = e / kDecodeCols, c = e % kDecodeCols;
    if (c < cols) st[e] = s[x * dv + c] * decay;
  }
  __syncthreads();
  const int c = threadIdx.x;
  if (c < cols) {
    float kv = 0.0f;
    for (int64_t x = 0; x < dk; ++x) kv = fmaf(st[x * kDecodeCols + c], kn[x], kv);
    const float vc = a.v[b * a.vs + h * dv + c0 + c];
    delta[c] = (vc - kv) * a.beta[b * a.n_v_heads + h];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < dk * kDecodeCols; e += blockDim.x) {
    const int64_t x = e / kDecodeCols, cc = e % kDecodeCols;
    if (cc < cols) {
      const float nv = fmaf(kn[x], delta[cc], st[e]);
      st[e] = nv;
      s[x * dv + cc] = nv;
    }
  }
  __syncthreads();
  if (c < cols) {
    float acc = 0.0f;
    for (int64_t x = 0; x < dk; ++x) acc = fmaf(st[x * kDecodeCols + c], qn[x], acc);
    a.o[(b * a.n_v_heads + h) * dv + c0 + c] = acc;
  }
}

// ---------------------------------------------------------------------------
// Prefill: one block of kPrefillThreads per (value head, slice of `cols`
// value columns); it walks the call's segments of the absolute block grid
// (each at most one block of L <= GatedDeltaBlockSize(chunk_size) <= 64
// tokens; kernels/gated_delta_params.h), carrying its [dk, cols] slice of
// the state S in shared memory. Columns of S are independent under the rule,
// so a slice needs only its own columns of v. Per segment, with q, k prepared,
// gc_i the cumulative log decay from the segment start (sequential adds, as
// the CPU), e_i = exp(gc_i):
//   A[i][j]  = (beta_i k_i . k_j) exp(gc_i - gc_j)     j < i      (UT system)
//   QK[i][j] = (q_i . k_j) exp(gc_i - gc_j)            j <= i
//   QS[i][c] = q_i . S[:, c]
//   R[i][c]  = beta_i (v_i[c] - e_i (k_i . S[:, c]))
//   (I + A) Vn = R by forward substitution (Vn: the corrected values)
//   o_i[c]   = e_i QS[i][c] + sum_j QK[i][j] Vn[j][c]
//   S[x][c]  = e_L S[x][c] + sum_j (k_j[x] exp(gc_L - gc_j)) Vn[j][c]
// Mathematically the CPU's chunked rule (W S folded into the right-hand side).
// The state at each boundary depends only on the state at the segment start
// and the segment's tokens.
// ---------------------------------------------------------------------------

constexpr int kPrefillThreads = 256;
constexpr int kSolveRows = 16;  // rows of the UT solve done in order by one thread per column
constexpr int kMaxPrefillCols = 32;
constexpr int64_t kPrefillMaxSmemBytes = 160 * 1024;

struct PrefillArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  const float* initial_state;
  float* o;
  float* final_state;
  float* chunk_states;
  int64_t seqlen;
  int64_t n_k_heads;
  int64_t n_v_heads;
  int64_t dk;
  int64_t dv;
  int64_t chunk_size;
  int64_t block;  // GatedDeltaBlockSize(chunk_size): segment grid and shared-memory rows
  int64_t start_pos;
  int64_t qs, ks, vs;
  int64_t n_slices;
  int cols;  // value columns per block
  int ldk;   // row stride of q, k in shared memory (odd: no bank conflicts)
  int ldc;   // row stride of the [L, L] products (odd)
  bool l2norm;
};

struct PrefillLayout {
  int64_t qc, kc, amat, qk, st, qs, vn, gc, eg, bt, dl, total;  // offsets in floats
};

__host__ __device__ inline PrefillLayout MakePrefillLayout(int64_t dk, int cols, int ldk, int ldc, int64_t cs) {
  PrefillLayout l;
  int64_t o = 0;
  l.qc = o;
  o += cs * ldk;
  l.kc = o;
  o += cs * ldk;
  l.amat = o;
  o += cs * ldc;
  l.qk = o;
  o += cs * ldc;
  l.st = o;
  o += dk * cols;
  l.qs = o;
  o += cs * cols;
  l.vn = o;
  o += cs * cols;
  l.gc = o;
  o += cs;
  l.eg = o;
  o += cs;
  l.bt = o;
  o += cs;
  l.dl = o;
  o += cs;
  l.total = o;
  return l;
}

__global__ void __launch_bounds__(kPrefillThreads) PrefillKernel(PrefillArgs a) {
  const int64_t slice = blockIdx.x % a.n_slices;
  const int64_t h = blockIdx.x / a.n_slices;
  const int64_t dk = a.dk, dv = a.dv, cs = a.block, hv = a.n_v_heads;
  const int64_t kh = h / (hv / a.n_k_heads);
  const int64_t c0 = slice * a.cols;
  const int cols = a.cols;
  const int ncols = static_cast<int>(Min<int64_t>(cols, dv - c0));
  const int ldk = a.ldk, ldc = a.ldc;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int warp = tid / 32, warps = nthreads / 32;
  HS_DYNAMIC_SMEM(float, smem);
  const PrefillLayout lay = MakePrefillLayout(dk, cols, ldk, ldc, cs);
  float* qc = smem + lay.qc;
  float* kc = smem + lay.kc;
  float* am = smem + lay.amat;
  float* qk = smem + lay.qk;
  float* st = smem + lay.st;
  float* qsm = smem + lay.qs;
  float* vn = smem + lay.vn;
  float* gc = smem + lay.gc;
  float* eg = smem + lay.eg;
  float* bt = smem + lay.bt;
  float* dl = smem + lay.dl;
  const float qscale = 1.0f / sqrtf(static_cast<float>(dk));
  const int64_t head_state = h * dk * dv + c0;

  for (int64_t e = tid; e < dk * cols; e += nthreads) {
    const int64_t x = e / cols, c = e % cols;
    st[e] = (a.initial_state != nullptr && c < ncols) ? a.initial_state[head_state + x * dv + c] : 0.0f;
  }
  int64_t row = 0;
  int64_t t0 = 0;
  while (t0 < a.seqlen) {
    const int64_t pos = a.start_pos + t0;
    const int64_t t1 = Min(a.seqlen, t0 + (cs - pos % cs));
    const int len = static_cast<int>(t1 - t0);
    __syncthreads();  // the previous segment's readers of every buffer are done
    // Prepared q and k: one warp per token.
    for (int i = warp; i < len; i += warps) {
      const int64_t t = t0 + i;
      PrepareVectorWarp(a.q + t * a.qs + kh * dk, dk, a.l2norm, qscale, qc + i * ldk);
      PrepareVectorWarp(a.k + t * a.ks + kh * dk, dk, a.l2norm, 1.0f, kc + i * ldk);
    }
    if (tid == 0) {
      float cum = 0.0f;
      for (int i = 0; i < len; ++i) {
        cum += a.g[(t0 + i) * hv + h];
        gc[i] = cum;
        eg[i] = expf(cum);
        bt[i] = a.beta[(t0 + i) * hv + h];
      }
      for (int i = 0; i < len; ++i) dl[i] = expf(cum - gc[i]);
    }
    __syncthreads();
    // A (strictly lower) and QK (lower with the diagonal).
    for (int e = tid; e < len * len; e += nthreads) {
      const int i = e / len, j = e % len;
      if (j > i) continue;
      float kk = 0.0f, qkv = 0.0f;
      for (int64_t x = 0; x < dk; ++x) {
        const float kj = kc[j * ldk + x];
        kk = fmaf(kc[i * ldk + x], kj, kk);
        qkv = fmaf(qc[i * ldk + x], kj, qkv);
      }
      const float dec = expf(gc[i] - gc[j]);
      am[i * ldc + j] = j < i ? (bt[i] * kk) * dec : 0.0f;
      qk[i * ldc + j] = qkv * dec;
    }
    // QS and the right-hand side R (in vn).
    for (int e = tid; e < len * cols; e += nthreads) {
      const int i = e / cols, c = e % cols;
      float qsv = 0.0f, ksv = 0.0f;
      for (int64_t x = 0; x < dk; ++x) {
        const float sv = st[x * cols + c];
        qsv = fmaf(qc[i * ldk + x], sv, qsv);
        ksv = fmaf(kc[i * ldk + x], sv, ksv);
      }
      qsm[e] = qsv;
      const float vv = c < ncols ? a.v[(t0 + i) * a.vs + h * dv + c0 + c] : 0.0f;
      vn[e] = bt[i] * (vv - eg[i] * ksv);
    }
    __syncthreads();
    // Forward substitution in row blocks of kSolveRows: the terms of the
    // solved rows j < b0 for every (row, column) of the block at once, then the
    // block's own rows in order, one thread per column. Each element is the
    // same chain either way: acc = R[i][c], then fmaf(-A[i][j], Vn[j][c], acc)
    // for j = 0, 1, ..., i - 1.
    for (int b0 = 0; b0 < len; b0 += kSolveRows) {
      const int b1 = static_cast<int>(Min<int64_t>(len, b0 + kSolveRows));
      if (b0 > 0) {
        for (int e = tid; e < (b1 - b0) * cols; e += nthreads) {
          const int i = b0 + e / cols, c = e % cols;
          float acc = vn[i * cols + c];
          for (int j = 0; j < b0; ++j) acc = fmaf(-am[i * ldc + j], vn[j * cols + c], acc);
          vn[i * cols + c] = acc;
        }
        __syncthreads();
      }
      if (tid < cols) {
        for (int i = b0 + 1; i < b1; ++i) {
          float acc = vn[i * cols + tid];
          for (int j = b0; j < i; ++j) acc = fmaf(-am[i * ldc + j], vn[j * cols + tid], acc);
          vn[i * cols + tid] = acc;
        }
      }
      __syncthreads();
    }
    // Outputs.
    for (int e = tid; e < len * cols; e += nthreads) {
      const int i = e / cols, c = e % cols;
      float acc = eg[i] * qsm[e];
      for (int j = 0; j <= i; ++j) acc = fmaf(qk[i * ldc + j], vn[j * cols + c], acc);
      if (c < ncols) a.o[((t0 + i) * hv + h) * dv + c0 + c] = acc;
    }
    // State recurrence (reads vn, kc, dl; writes only st, which nothing above
    // reads after the last barrier; dl[j] = exp(gc_L - gc_j)).
    const float elast = eg[len - 1];
    for (int64_t e = tid; e < dk * cols; e += nthreads) {
      const int64_t x = e / cols, c = e % cols;
      float acc = st[e] * elast;
      for (int j = 0; j < len; ++j) acc = fmaf(kc[j * ldk + x] * dl[j], vn[j * cols + c], acc);
      st[e] = acc;
    }
    const int64_t end = a.start_pos + t1;
    if (end % a.chunk_size == 0) {
      if (a.chunk_states != nullptr) {
        float* dst = a.chunk_states + row * hv * dk * dv + head_state;
        for (int64_t e = tid; e < dk * cols; e += nthreads) {
          const int64_t x = e / cols, c = e % cols;
          if (c < ncols) dst[x * dv + c] = st[e];
        }
      }
      ++row;
    }
    t0 = t1;
  }
  if (a.final_state != nullptr) {
    for (int64_t e = tid; e < dk * cols; e += nthreads) {
      const int64_t x = e / cols, c = e % cols;
      if (c < ncols) a.final_state[head_state + x * dv + c] = st[e];
    }
  }
}

// kPrefillMaxSmemBytes, or the device's opt-in limit where smaller (never
// below the 48 KiB every device grants).
int64_t PrefillSmemBudget() {
  int device = 0;
  int optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    optin = 48 * 1024;
  }
  return Min<int64_t>(kPrefillMaxSmemBytes, Max<int64_t>(optin, 48 * 1024));
}

// Dynamic shared memory above 48 KiB needs the kernel's opt-in.
int OptIn(const void* kernel, size_t smem) {
  if (smem <= 48 * 1024) return kKernelOk;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  return err == cudaSuccess ? kKernelOk : kKernelDeviceError;
}

}  // namespace

int GatedDeltaGates(const GatedDeltaGatesParams& p, const CudaLaunchContext& ctx) {
  if (CheckGatedDeltaGatesParams(p) != kKernelOk) return kKernelInvalidArgument;
  if (p.n_tokens == 0) return kKernelOk;
  GateArgs a;
  a.a = p.a;
  a.b = p.b;
  a.dt_bias = p.dt_bias;
  a.a_log = p.a_log;
  a.g = p.g;
  a.beta = p.beta;
  a.n_tokens = p.n_tokens;
  a.n_heads = p.n_heads;
  a.as = p.a_row_stride ? p.a_row_stride : p.n_heads;
  a.bs = p.b_row_stride ? p.b_row_stride : p.n_heads;
  const int64_t blocks = Min<int64_t>(CeilDiv(p.n_tokens * p.n_heads, kGateThreads), 65535);
  return LaunchStatus(
      Launch(GatesKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kGateThreads), 0, ctx.stream, a));
}

int GatedDeltaPrefill(const GatedDeltaParams& p, const CudaLaunchContext& ctx) {
  if (CheckGatedDeltaParams(p) != kKernelOk) return kKernelInvalidArgument;
  if (p.seqlen == 0 && (p.final_state == nullptr || p.final_state == p.initial_state)) return kKernelOk;
  const int ldk = static_cast<int>(p.dk % 2 == 0 ? p.dk + 1 : p.dk);
  const int64_t block = GatedDeltaBlockSize(p.chunk_size);
  const int ldc = static_cast<int>(block % 2 == 0 ? block + 1 : block);
  // Value columns per block: the most (<= 32) that fit the budget.
  int cols = static_cast<int>(Min<int64_t>(kMaxPrefillCols, p.dv));
  const int64_t budget = PrefillSmemBudget();
  auto bytes = [&] {
    return MakePrefillLayout(p.dk, cols, ldk, ldc, block).total * static_cast<int64_t>(sizeof(float));
  };
  while (bytes() > budget && cols > 1) cols = (cols + 1) / 2;
  if (bytes() > budget) return kKernelUnsupported;  // very large dk: one chunk's q and k do not fit
  PrefillArgs a;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.g = p.g;
  a.beta = p.beta;
  a.initial_state = p.initial_state;
  a.o = p.o;
  a.final_state = p.final_state;
  a.chunk_states = p.chunk_states;
  a.seqlen = p.seqlen;
  a.n_k_heads = p.n_k_heads;
  a.n_v_heads = p.n_v_heads;
  a.dk = p.dk;
  a.dv = p.dv;
  a.chunk_size = p.chunk_size;
  a.block = block;
  a.start_pos = p.start_pos;
  a.qs = p.q_token_stride ? p.q_token_stride : p.n_k_heads * p.dk;
  a.ks = p.k_token_stride ? p.k_token_stride : p.n_k_heads * p.dk;
  a.vs = p.v_token_stride ? p.v_token_stride : p.n_v_heads * p.dv;
  a.n_slices = CeilDiv(p.dv, cols);
  a.cols = cols;
  a.ldk = ldk;
  a.ldc = ldc;
  a.l2norm = p.l2norm_qk;
  const int64_t blocks = a.n_slices * p.n_v_heads;
  if (blocks > 0x7fffffff) return kKernelUnsupported;
  const size_t smem = static_cast<size_t>(bytes());
  if (const int st = OptIn(reinterpret_cast<const void*>(&PrefillKernel), smem); st != kKernelOk) return st;
  return LaunchStatus(
      Launch(PrefillKernel, dim3(static_cast<unsigned int>(blocks)), dim3(kPrefillThreads), smem, ctx.stream, a));
}

int GatedDeltaDecode(const GatedDeltaDecodeParams& p, const CudaLaunchContext& ctx) {
  if (CheckGatedDeltaDecodeParams(p) != kKernelOk) return kKernelInvalidArgument;
  // Without slots, row b is slot b (the CPU's check).
  if (p.state_slots == nullptr && p.batch > p.num_slots) return kKernelInvalidArgument;
  if (p.batch == 0) return kKernelOk;
  DecodeArgs a;
  a.state = p.state;
  a.state_slots = p.state_slots;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.g = p.g;
  a.beta = p.beta;
  a.o = p.o;
  a.error_flag = ctx.error_flag;
  a.num_slots = p.num_slots;
  a.n_k_heads = p.n_k_heads;
  a.n_v_heads = p.n_v_heads;
  a.dk = p.dk;
  a.dv = p.dv;
  a.qs = p.q_batch_stride ? p.q_batch_stride : p.n_k_heads * p.dk;
  a.ks = p.k_batch_stride ? p.k_batch_stride : p.n_k_heads * p.dk;
  a.vs = p.v_batch_stride ? p.v_batch_stride : p.n_v_heads * p.dv;
  a.n_slices = CeilDiv(p.dv, kDecodeCols);
  a.l2norm = p.l2norm_qk;
  const size_t smem = static_cast<size_t>((2 * p.dk + p.dk * kDecodeCols + kDecodeCols) * sizeof(float));
  if (static_cast<int64_t>(smem) > PrefillSmemBudget()) return kKernelUnsupported;
  if (const int st = OptIn(reinterpret_cast<const void*>(&DecodeKernel), smem); st != kKernelOk) return st;
  // Launched in pieces of at most 2^31 - 1 blocks (grid.x's limit).
  const int64_t total = p.batch * p.n_v_heads * a.n_slices;
  constexpr int64_t kMaxGrid = 0x7fffffff;
  for (int64_t offset = 0; offset < total; offset += kMaxGrid) {
    const int64_t n = Min(kMaxGrid, total - offset);
    const cudaError_t err =
        Launch(DecodeKernel, dim3(static_cast<unsigned int>(n)), dim3(kDecodeThreads), smem, ctx.stream, a, offset);
    if (err != cudaSuccess) return kKernelDeviceError;
  }
  return kKernelOk;
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
