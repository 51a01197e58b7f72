// Paged-KV append and causal grouped-query attention (kernels/attention_params.h)
// on CUDA; kernels/cpu/attention.cc is the reference.
//
// Per-query arithmetic (the contract both attention kernels keep bit for bit).
// A query row (one query head at one position pos) is held by one warp: lane L
// owns dims d = L + 32 j (j < kVec = head_dim rounded up to a power of two
// >= 32, divided by 32) of q and of the accumulator. For each key block b =
// 0, 1, ... (logical page b: keys [b * page_size, min((b + 1) * page_size,
// pos + 1))), in order:
//   s_i   = WarpSum(fmaf chain over j of q[d] * k_i[d]) * scale    (__fmul_rn)
//   m'    = fmaxf(m, max_i s_i);  alpha = __expf(m - m')
//   l     = l * alpha, then l += __expf(s_i - m') in key order
//   acc   = acc * alpha, then acc = fmaf(p_i, v_i, acc) in key order
// and out = acc / l. Every operation is an explicit intrinsic (fmaf,
// __fmul_rn, __fadd_rn), so the compiler cannot contract differently in the
// two kernels. Scores of a block are kept in shared memory between the max and
// the accumulation when the block's rows x page_size fit (kMaxScoreFloats),
// otherwise recomputed: the same operations, the same bits. K/V are staged in
// shared memory in chunks of whole keys; the chunking only decides what is
// loaded when, never the order of any row's operations. So a row's bits
// depend only on its position, its q vector and K/V at positions <= pos: not
// on the batch, the other rows of its block, the prefill segment, the tile or
// the physical pages.
//
// Both attention kernels run AttendRows: a block of kWarps x kRowsPerWarp
// rows of one KV head (the rows of a prefill tile: consecutive tokens x the
// query heads of the group; or the query heads of one decode sequence) reads
// each page chunk of that KV head once into shared memory for all its rows.
//
// Validation: the launchers check the host-visible fields exactly as the CPU
// launchers do. Block tables and seq_lens are device memory: a kernel checks
// each entry it uses (a token's page for the appends, pages 0..pos/page_size
// for a query, seq_len >= 1 and its pages <= block_table_stride for decode)
// and, for one out of range, writes nothing for that token or query and
// raises ctx.error_flag; tokens and queries that need no bad entry are still
// written (the CPU writes nothing at all, and also rejects bad entries that
// no token or query reads).

#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launchers.h"

namespace hybridserve::kernels::HS_CUDA_NS {
namespace {

constexpr int kMaxHeadDim = 256;
// Shared memory: K and V chunks of ChunkKeys() keys, at most kKvChunkFloats
// floats each (32 KiB together), and scores of up to kMaxScoreFloats floats
// (12 KiB): under the 48 KiB a kernel gets without opting in.
constexpr int64_t kKvChunkFloats = 4096;
constexpr int64_t kMaxScoreFloats = 3072;
constexpr int kCopyThreads = 128;
// Prefill: 4 warps x 4 rows = 16 rows share each K/V chunk load.
constexpr int kPrefillWarps = 4;
constexpr int kPrefillRowsPerWarp = 4;
// Decode: one row (query head) per warp, up to 16 warps (heads of a group) per block.
constexpr int kDecodeMaxWarps = 16;

// Keys per K/V chunk in shared memory (head_dim <= kMaxHeadDim: at least 16).
__host__ __device__ __forceinline__ int64_t ChunkKeys(int64_t page_size, int64_t head_dim) {
  return Min<int64_t>(page_size, kKvChunkFloats / head_dim);
}

float ResolvedScale(float scale, int64_t head_dim) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// ---- KV append: plain copies ----

__device__ __forceinline__ void CopyTokenKv(const PagedKvCache& c, int64_t page, int64_t slot, const float* k,
                                            const float* v) {
  const int64_t n = c.n_kv_heads * c.head_dim;
  const int64_t offset = (page * c.page_size + slot) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    c.k[offset + i] = k[i];
    c.v[offset + i] = v[i];
  }
}

// Block t copies token t (position start_pos + t).
__global__ void __launch_bounds__(kCopyThreads)
    KvAppendKernel(PagedKvCache c, const float* k, const float* v, const int32_t* block_table, int64_t start_pos,
                   int64_t k_stride, int64_t v_stride, int32_t* error_flag) {
  const int64_t t = blockIdx.x;
  const int64_t pos = start_pos + t;
  const int32_t page = block_table[pos / c.page_size];
  if (page < 0 || page >= c.num_pages) {
    if (threadIdx.x == 0) ReportBadIndex(error_flag);
    return;
  }
  CopyTokenKv(c, page, pos % c.page_size, k + t * k_stride, v + t * v_stride);
}

// Block b copies sequence b's new token (position seq_lens[b] - 1).
__global__ void __launch_bounds__(kCopyThreads)
    KvAppendDecodeKernel(PagedKvCache c, const float* k, const float* v, const int32_t* block_tables,
                         const int32_t* seq_lens, int64_t table_stride, int64_t k_stride, int64_t v_stride,
                         int32_t* error_flag) {
  const int64_t b = blockIdx.x;
  const int64_t len = seq_lens[b];
  if (len < 1 || CeilDiv(len, c.page_size) > table_stride) {
    if (threadIdx.x == 0) ReportBadIndex(error_flag);
    return;
  }
  const int64_t pos = len - 1;
  const int32_t page = block_tables[b * table_stride + pos / c.page_size];
  if (page < 0 || page >= c.num_pages) {
    if (threadIdx.x == 0) ReportBadIndex(error_flag);
    return;
  }
  CopyTokenKv(c, page, pos % c.page_size, k + b * k_stride, v + b * v_stride);
}

// ---- Attention ----

// One query row's online-softmax state, in the registers of its warp (lane L
// holds dims L + 32 j).
template <int kVec>
struct Row {
  float q[kVec];
  float acc[kVec];
  float m;      // running max (all lanes equal)
  float l;      // running denominator (all lanes equal)
  float m_blk;  // max score of the current key block
};

// s = (q . k) * scale for one key row k[0, head_dim) in shared memory: each
// lane's fmaf chain over its dims, then the warp's xor butterfly. Every lane
// gets the same bits.
template <int kVec>
__device__ __forceinline__ float Score(const Row<kVec>& r, const float* k, int head_dim, float scale) {
  const int lane = threadIdx.x % 32;
  float partial = 0.0f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) partial = fmaf(r.q[j], k[d], partial);
  }
  return __fmul_rn(WarpSum(partial), scale);
}

// Start of a key block: fold the block max into the running state.
template <int kVec>
__device__ __forceinline__ void Rescale(Row<kVec>& r) {
  const float m_new = fmaxf(r.m, r.m_blk);
  const float alpha = __expf(__fadd_rn(r.m, -m_new));
  r.l = __fmul_rn(r.l, alpha);
#pragma unroll
  for (int j = 0; j < kVec; ++j) r.acc[j] = __fmul_rn(r.acc[j], alpha);
  r.m = m_new;
}

// One key of the current block, in key order: its weight and value row v.
template <int kVec>
__device__ __forceinline__ void Accumulate(Row<kVec>& r, float s, const float* v, int head_dim) {
  const int lane = threadIdx.x % 32;
  const float p = __expf(__fadd_rn(s, -r.m));
  r.l = __fadd_rn(r.l, p);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) r.acc[j] = fmaf(p, v[d], r.acc[j]);
  }
}

// Where the rows of a block come from: row lr (local index lr = k * kWarps +
// warp) has query q_row, output out_row and position pos; rows past the end
// have valid = false.
struct RowSlot {
  const float* q = nullptr;
  float* out = nullptr;
  int64_t pos = -1;
  bool valid = false;
};

// Loads keys [first, first + count) of `page` (one KV head: kv_base is the
// head's offset) from `pool` into dst[i * head_dim + d], by all threads. A
// plain copy: which thread moves which float never changes a bit.
//
// Where head_dim is a multiple of 4 that divides into the block (every real
// model: 64, 128, 256 with 128+ threads) and the rows are 16-byte aligned,
// each thread keeps one float4 column and steps over rows, with no division
// in the loop; the general path divides in 32 bits. The first version
// divided in 64 bits for every float: on an H200 decode attention took 175 us
// per call at 192 keys with 4 warps per SM stalled on it, and this copy took
// the bench model's decode at batch 1 from 925 to 1216 tokens/s.
__device__ __forceinline__ void LoadChunk(float* dst, const float* pool, int64_t page, int64_t first_slot,
                                          int64_t count, const PagedKvCache& c, int64_t kv_head) {
  const int D = static_cast<int>(c.head_dim);
  const int64_t token_stride = c.n_kv_heads * c.head_dim;
  const float* src = pool + (page * c.page_size + first_slot) * token_stride + kv_head * c.head_dim;
  const int n = static_cast<int>(count);  // <= ChunkKeys(): at most kKvChunkFloats / head_dim
  const int threads = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const int d4 = D / 4;
  if (D % 4 == 0 && threads % d4 == 0 && token_stride % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const int col = t % d4;
    const int rows_per_step = threads / d4;
    const float4* s4 = reinterpret_cast<const float4*>(src) + col;
    float4* d4p = reinterpret_cast<float4*>(dst) + col;
    const int64_t row_stride4 = token_stride / 4;
    for (int i = t / d4; i < n; i += rows_per_step) d4p[i * d4] = s4[i * row_stride4];
    return;
  }
  for (int e = t; e < n * D; e += threads) {
    const int i = e / D;
    dst[e] = src[i * token_stride + (e - i * D)];
  }
}

// The attention of one block's rows (all of KV head kv_head, all reading the
// block table `table`) over keys [0, pos] each; last_key is the largest pos of
// the block's valid rows. Must be called by every thread of the block (it
// synchronizes). Shared memory: see AttendSmemBytes.
template <int kVec, int kRowsPerWarp>
__device__ __forceinline__ void AttendRows(const PagedKvCache& c, const int32_t* table, int64_t kv_head,
                                           const RowSlot* slots, int64_t last_key, float scale, int32_t* error_flag) {
  HS_DYNAMIC_SMEM(float, smem);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  const int D = static_cast<int>(c.head_dim);
  const int64_t ps = c.page_size;
  const int64_t chunk = ChunkKeys(ps, D);
  const int64_t rows_per_block = static_cast<int64_t>(warps) * kRowsPerWarp;
  const bool store_scores = rows_per_block * ps <= kMaxScoreFloats;
  float* k_s = smem;                     // [chunk, head_dim]
  float* v_s = smem + chunk * D;         // [chunk, head_dim]
  float* scores = smem + 2 * chunk * D;  // [rows_per_block, page_size] when store_scores

  Row<kVec> rows[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const RowSlot& s = slots[k];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int d = lane + 32 * j;
      rows[k].q[j] = s.valid && d < D ? s.q[d] : 0.0f;
      rows[k].acc[j] = 0.0f;
    }
    rows[k].m = -INFINITY;
    rows[k].l = 0.0f;
  }

  // Keys at or past bad_key sit on a page the table names out of range: rows
  // that need them are skipped.
  int64_t bad_key = last_key + 1;
  const int64_t n_blocks = last_key / ps + 1;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t page = table[b];
    if (page < 0 || page >= c.num_pages) {
      if (threadIdx.x == 0) ReportBadIndex(error_flag);
      bad_key = b * ps;
      break;
    }
    const int64_t block_first = b * ps;
    const int64_t block_end = Min(block_first + ps, last_key + 1);  // keys any row of this block needs

    // Pass 1: scores and the block max of every row.
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) rows[k].m_blk = -INFINITY;
    for (int64_t first = block_first; first < block_end; first += chunk) {
      const int64_t count = Min(chunk, block_end - first);
      __syncthreads();  // the previous chunk is no longer read
      LoadChunk(k_s, c.k, page, first - block_first, count, c, kv_head);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        const RowSlot& s = slots[k];
        if (!s.valid || s.pos < first) continue;
        const int64_t n = Min(count, s.pos - first + 1);
        const int64_t lr = static_cast<int64_t>(k) * warps + warp;
        for (int64_t i = 0; i < n; ++i) {
          const float score = Score(rows[k], k_s + i * D, D, scale);
          rows[k].m_blk = fmaxf(rows[k].m_blk, score);
          if (store_scores && lane == 0) scores[lr * ps + (first - block_first) + i] = score;
        }
      }
    }

    // Pass 2: rescale, then weights and values in key order.
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      if (slots[k].valid && slots[k].pos >= block_first) Rescale(rows[k]);
    }
    for (int64_t first = block_first; first < block_end; first += chunk) {
      const int64_t count = Min(chunk, block_end - first);
      __syncthreads();  // pass 1's chunk, or the previous one, is no longer read; scores are written
      LoadChunk(v_s, c.v, page, first - block_first, count, c, kv_head);
      if (!store_scores) LoadChunk(k_s, c.k, page, first - block_first, count, c, kv_head);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kRowsPerWarp; ++k) {
        const RowSlot& s = slots[k];
        if (!s.valid || s.pos < first) continue;
        const int64_t n = Min(count, s.pos - first + 1);
        const int64_t lr = static_cast<int64_t>(k) * warps + warp;
        for (int64_t i = 0; i < n; ++i) {
          const float score =
              store_scores ? scores[lr * ps + (first - block_first) + i] : Score(rows[k], k_s + i * D, D, scale);
          Accumulate(rows[k], score, v_s + i * D, D);
        }
      }
    }
  }

#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const RowSlot& s = slots[k];
    if (!s.valid || s.pos >= bad_key) continue;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int d = lane + 32 * j;
      if (d < D) s.out[d] = rows[k].acc[j] / rows[k].l;
    }
  }
}

size_t AttendSmemBytes(int64_t rows_per_block, int64_t page_size, int64_t head_dim) {
  const int64_t score_floats = rows_per_block * page_size <= kMaxScoreFloats ? rows_per_block * page_size : 0;
  return static_cast<size_t>(2 * ChunkKeys(page_size, head_dim) * head_dim + score_floats) * sizeof(float);
}

struct PrefillArgs {
  PagedKvCache cache;
  const float* q;
  float* out;
  const int32_t* block_table;
  int64_t start_pos;
  int64_t n_tokens;
  int64_t group;  // query heads per KV head
  int64_t q_stride;
  int64_t out_stride;
  float scale;
  int32_t* error_flag;
};

// Grid (row tiles, n_kv_heads). For KV head h the rows are r = t * group + g
// (token t, query head h * group + g); block x takes rows [x * R, (x + 1) * R)
// with R = kPrefillWarps * kPrefillRowsPerWarp, row lr = k * kWarps + warp.
template <int kVec>
__global__ void __launch_bounds__(kPrefillWarps * 32) AttentionPrefillKernel(PrefillArgs a) {
  const int64_t kv_head = blockIdx.y;
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int64_t rows_total = a.n_tokens * a.group;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * warps * kPrefillRowsPerWarp;
  const int64_t row_last = Min(row0 + static_cast<int64_t>(warps) * kPrefillRowsPerWarp, rows_total) - 1;
  RowSlot slots[kPrefillRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kPrefillRowsPerWarp; ++k) {
    const int64_t r = row0 + static_cast<int64_t>(k) * warps + warp;
    if (r >= rows_total) continue;
    const int64_t t = r / a.group;
    const int64_t head = kv_head * a.group + r % a.group;
    slots[k].q = a.q + t * a.q_stride + head * a.cache.head_dim;
    slots[k].out = a.out + t * a.out_stride + head * a.cache.head_dim;
    slots[k].pos = a.start_pos + t;
    slots[k].valid = true;
  }
  const int64_t last_key = a.start_pos + row_last / a.group;
  AttendRows<kVec, kPrefillRowsPerWarp>(a.cache, a.block_table, kv_head, slots, last_key, a.scale, a.error_flag);
}

struct DecodeArgs {
  PagedKvCache cache;
  const float* q;
  float* out;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  int64_t group;
  int64_t row_tiles;  // blocks per (sequence, KV head)
  int64_t table_stride;
  int64_t q_stride;
  int64_t out_stride;
  float scale;
  int32_t* error_flag;
};

// Grid (batch * row_tiles, n_kv_heads): block x serves sequence x / row_tiles
// and its query heads kv_head * group + g for g in [tile * warps, (tile + 1) *
// warps), one per warp.
template <int kVec>
__global__ void __launch_bounds__(kDecodeMaxWarps * 32, 1) AttentionDecodeKernel(DecodeArgs a) {
  const int64_t kv_head = blockIdx.y;
  const int64_t b = blockIdx.x / a.row_tiles;
  const int64_t tile = blockIdx.x % a.row_tiles;
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32;
  const int64_t len = a.seq_lens[b];
  if (len < 1 || CeilDiv(len, a.cache.page_size) > a.table_stride) {
    if (threadIdx.x == 0) ReportBadIndex(a.error_flag);
    return;  // the whole block leaves together: no barrier is left waiting
  }
  RowSlot slots[1];
  const int64_t g = tile * warps + warp;
  if (g < a.group) {
    const int64_t head = kv_head * a.group + g;
    slots[0].q = a.q + b * a.q_stride + head * a.cache.head_dim;
    slots[0].out = a.out + b * a.out_stride + head * a.cache.head_dim;
    slots[0].pos = len - 1;
    slots[0].valid = true;
  }
  AttendRows<kVec, 1>(a.cache, a.block_tables + b * a.table_stride, kv_head, slots, len - 1, a.scale, a.error_flag);
}

// kVec for a head_dim <= kMaxHeadDim: dims per lane, a power of two.
int VecFor(int64_t head_dim) { return head_dim <= 32 ? 1 : head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8; }

}  // namespace

int KvAppend(const KvAppendParams& p, const CudaLaunchContext& ctx) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckKvAppendParams(p); status != kKernelOk) return status;
  if (p.n_tokens == 0) return kKernelOk;
  const int64_t ks = p.k_token_stride ? p.k_token_stride : c.n_kv_heads * c.head_dim;
  const int64_t vs = p.v_token_stride ? p.v_token_stride : c.n_kv_heads * c.head_dim;
  return LaunchStatus(Launch(KvAppendKernel, dim3(static_cast<unsigned int>(p.n_tokens)), dim3(kCopyThreads), 0,
                             ctx.stream, c, p.k, p.v, p.block_table, p.start_pos, ks, vs, ctx.error_flag));
}

int KvAppendDecode(const KvAppendDecodeParams& p, const CudaLaunchContext& ctx) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckKvAppendDecodeParams(p); status != kKernelOk) return status;
  if (p.batch == 0) return kKernelOk;
  const int64_t ks = p.k_batch_stride ? p.k_batch_stride : c.n_kv_heads * c.head_dim;
  const int64_t vs = p.v_batch_stride ? p.v_batch_stride : c.n_kv_heads * c.head_dim;
  return LaunchStatus(Launch(KvAppendDecodeKernel, dim3(static_cast<unsigned int>(p.batch)), dim3(kCopyThreads), 0,
                             ctx.stream, c, p.k, p.v, p.block_tables, p.seq_lens, p.block_table_stride, ks, vs,
                             ctx.error_flag));
}

int AttentionPrefill(const AttentionPrefillParams& p, const CudaLaunchContext& ctx) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckAttentionPrefillParams(p); status != kKernelOk) return status;
  if (c.head_dim > kMaxHeadDim || c.n_kv_heads > 65535) return kKernelUnsupported;
  if (p.n_tokens == 0) return kKernelOk;
  PrefillArgs a;
  a.cache = c;
  a.q = p.q;
  a.out = p.out;
  a.block_table = p.block_table;
  a.start_pos = p.start_pos;
  a.n_tokens = p.n_tokens;
  a.group = p.n_heads / c.n_kv_heads;
  a.q_stride = p.q_token_stride ? p.q_token_stride : p.n_heads * c.head_dim;
  a.out_stride = p.out_token_stride ? p.out_token_stride : p.n_heads * c.head_dim;
  a.scale = ResolvedScale(p.scale, c.head_dim);
  a.error_flag = ctx.error_flag;
  const int64_t rows_per_block = kPrefillWarps * kPrefillRowsPerWarp;
  const dim3 grid(static_cast<unsigned int>(CeilDiv(p.n_tokens * a.group, rows_per_block)),
                  static_cast<unsigned int>(c.n_kv_heads));
  const dim3 block(kPrefillWarps * 32);
  const size_t smem = AttendSmemBytes(rows_per_block, c.page_size, c.head_dim);
  switch (VecFor(c.head_dim)) {
    case 1:
      return LaunchStatus(Launch(AttentionPrefillKernel<1>, grid, block, smem, ctx.stream, a));
    case 2:
      return LaunchStatus(Launch(AttentionPrefillKernel<2>, grid, block, smem, ctx.stream, a));
    case 4:
      return LaunchStatus(Launch(AttentionPrefillKernel<4>, grid, block, smem, ctx.stream, a));
    default:
      return LaunchStatus(Launch(AttentionPrefillKernel<8>, grid, block, smem, ctx.stream, a));
  }
}

int AttentionDecode(const AttentionDecodeParams& p, const CudaLaunchContext& ctx) {
  const PagedKvCache& c = p.cache;
  if (const int status = CheckAttentionDecodeParams(p); status != kKernelOk) return status;
  if (c.head_dim > kMaxHeadDim || c.n_kv_heads > 65535) return kKernelUnsupported;
  if (p.batch == 0) return kKernelOk;
  DecodeArgs a;
  a.cache = c;
  a.q = p.q;
  a.out = p.out;
  a.block_tables = p.block_tables;
  a.seq_lens = p.seq_lens;
  a.group = p.n_heads / c.n_kv_heads;
  a.table_stride = p.block_table_stride;
  a.q_stride = p.q_batch_stride ? p.q_batch_stride : p.n_heads * c.head_dim;
  a.out_stride = p.out_batch_stride ? p.out_batch_stride : p.n_heads * c.head_dim;
  a.scale = ResolvedScale(p.scale, c.head_dim);
  a.error_flag = ctx.error_flag;
  const int64_t warps = Min<int64_t>(a.group, kDecodeMaxWarps);
  a.row_tiles = CeilDiv(a.group, warps);
  const dim3 grid(static_cast<unsigned int>(p.batch * a.row_tiles), static_cast<unsigned int>(c.n_kv_heads));
  const dim3 block(static_cast<unsigned int>(warps * 32));
  const size_t smem = AttendSmemBytes(warps, c.page_size, c.head_dim);
  switch (VecFor(c.head_dim)) {
    case 1:
      return LaunchStatus(Launch(AttentionDecodeKernel<1>, grid, block, smem, ctx.stream, a));
    case 2:
      return LaunchStatus(Launch(AttentionDecodeKernel<2>, grid, block, smem, ctx.stream, a));
    case 4:
      return LaunchStatus(Launch(AttentionDecodeKernel<4>, grid, block, smem, ctx.stream, a));
    default:
      return LaunchStatus(Launch(AttentionDecodeKernel<8>, grid, block, smem, ctx.stream, a));
  }
}

}  // namespace hybridserve::kernels::HS_CUDA_NS
