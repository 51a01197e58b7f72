// Deterministic matmul: fixed per-element reduction order, AVX2/FMA register
// tiles in the dot-product form (both operands contiguous along k).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Bytes of fp32 w per cache block: a block of columns (all of k) stays in L2
// while every row tile of a streams past it.
constexpr int64_t kBlockBytes = 384 * 1024;
// k per block (a multiple of 8 * kChains): the a panel of a row tile
// (3 * kKc * 4 = 12 KiB) stays in L1 across the column tiles of a block.
constexpr int64_t kKc = 1024;
// Each output sums its k in kChains interleaved chains: 8-element step s
// (k in [8s, 8s + 8)) goes to chain s mod kChains (matmul.h).
constexpr int kChains = 2;
constexpr int64_t kChainStride = 8 * kChains;
static_assert(kKc % kChainStride == 0, "k blocks must start on the chains' period");
// Columns per parallel task and granule of column blocks: a multiple of every
// tile width (4, 6, 8).
constexpr int64_t kTaskCols = 24;
// From this many rows on, bf16 weights are widened once per column block into
// a scratch buffer (amortized over the row tiles) instead of at every use.
constexpr int64_t kBf16WidenMinRows = 8;

int64_t ColumnsPerBlock(int64_t k) {
  const int64_t cols = kBlockBytes / (4 * std::max<int64_t>(k, 1));
  return std::max<int64_t>(kTaskCols, cols / kTaskCols * kTaskCols);
}

inline __m256 LoadW(const float* w, int64_t rem) { return rem >= 8 ? _mm256_loadu_ps(w) : simd::LoadPartial(w, rem); }
inline __m256 LoadW(const uint16_t* w, int64_t rem) {
  return rem >= 8 ? simd::LoadBf16(w) : simd::LoadBf16Partial(w, rem);
}

// The two chains of one output, added and reduced to a float.
inline float SumChains(__m256 c0, __m256 c1) { return simd::Hsum(_mm256_add_ps(c0, c1)); }

// Accumulates rows [0, MR) of a against columns [0, NR) of w over the steps
// of chain `chain` in [k_begin, k_end) (k_begin a multiple of kChainStride;
// the last step zero-padded) into acc (MR * NR vectors), which it loads from
// / stores to acc_io.
template <int MR, int NR, typename WT>
inline void MicroKernel(const float* a, int64_t lda, const WT* w, int64_t ldw, int64_t k_begin, int64_t k_end,
                        int chain, bool load_acc, float* acc_io) {
  __m256 acc[MR * NR];
#pragma unroll
  for (int t = 0; t < MR * NR; ++t) {
    acc[t] = load_acc ? _mm256_loadu_ps(acc_io + 8 * t) : _mm256_setzero_ps();
  }
  int64_t kk = k_begin + 8 * chain;
  for (; kk + 8 <= k_end; kk += kChainStride) {
    __m256 av[MR];
#pragma unroll
    for (int i = 0; i < MR; ++i) av[i] = _mm256_loadu_ps(a + i * lda + kk);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = LoadW(w + j * ldw + kk, 8);
#pragma unroll
      for (int i = 0; i < MR; ++i) acc[i * NR + j] = _mm256_fmadd_ps(av[i], wv, acc[i * NR + j]);
    }
  }
  if (kk < k_end) {  // the partial last step, this chain's
    const int64_t rem = k_end - kk;
    __m256 av[MR];
#pragma unroll
    for (int i = 0; i < MR; ++i) av[i] = simd::LoadPartial(a + i * lda + kk, rem);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const __m256 wv = LoadW(w + j * ldw + kk, rem);
#pragma unroll
      for (int i = 0; i < MR; ++i) acc[i * NR + j] = _mm256_fmadd_ps(av[i], wv, acc[i * NR + j]);
    }
  }
#pragma unroll
  for (int t = 0; t < MR * NR; ++t) _mm256_storeu_ps(acc_io + 8 * t, acc[t]);
}

struct Job {
  const MatmulParams* p;
  int64_t lda, ldw, ldo;
};

// out[i, j] from the chain sum r: r + bias, then out + r when accumulating.
inline void Store(const Job& job, int64_t i, int64_t j, float r) {
  const MatmulParams& p = *job.p;
  float* out = p.out + i * job.ldo + j;
  if (p.bias != nullptr) r = r + p.bias[j];
  if (p.accumulate) r = *out + r;
  *out = r;
}

// Reduces the accumulators of an MR x NR tile at (i0, j0) (chain c's at
// acc_io + c * MR * NR * 8) and writes out.
template <int MR, int NR>
inline void Finish(const Job& job, int64_t i0, int64_t j0, const float* acc_io) {
  constexpr int64_t kChainFloats = MR * NR * 8;
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      const float* t = acc_io + 8 * (i * NR + j);
      Store(job, i0 + i, j0 + j, SumChains(_mm256_loadu_ps(t), _mm256_loadu_ps(t + kChainFloats)));
    }
  }
}

// Rows [i0, i0 + MR) x columns [j_begin, j_end): tiles of NR columns, then
// single columns for the remainder. k blocks are the outer loop so that the a
// panel of a k block stays in L1 across the column tiles; each tile runs its
// chains one after the other (its weights stay in L1 across them), and its
// accumulators wait in `acc` between k blocks.
template <int MR, int NR, typename WT>
void RowPanel(const Job& job, const WT* w, int64_t i0, int64_t j_begin, int64_t j_end, std::vector<float>& acc) {
  const MatmulParams& p = *job.p;
  const int64_t full_tiles = (j_end - j_begin) / NR;
  const int64_t j_tail = j_begin + full_tiles * NR;
  const int64_t tiles = full_tiles + (j_end - j_tail);
  constexpr int64_t kTileFloats = kChains * MR * NR * 8;
  acc.resize(tiles * kTileFloats);
  const float* a = p.a + i0 * job.lda;
  for (int64_t k0 = 0; k0 == 0 || k0 < p.k; k0 += kKc) {  // k == 0: zeros
    const int64_t k1 = std::min(p.k, k0 + kKc);
    for (int64_t t = 0; t < full_tiles; ++t) {
      for (int c = 0; c < kChains; ++c) {
        MicroKernel<MR, NR>(a, job.lda, w + (j_begin + t * NR) * job.ldw, job.ldw, k0, k1, c, k0 > 0,
                            acc.data() + t * kTileFloats + c * MR * NR * 8);
      }
    }
    for (int64_t j = j_tail; j < j_end; ++j) {
      for (int c = 0; c < kChains; ++c) {
        MicroKernel<MR, 1>(a, job.lda, w + j * job.ldw, job.ldw, k0, k1, c, k0 > 0,
                           acc.data() + (full_tiles + j - j_tail) * kTileFloats + c * MR * 8);
      }
    }
  }
  for (int64_t t = 0; t < full_tiles; ++t) {
    Finish<MR, NR>(job, i0, j_begin + t * NR, acc.data() + t * kTileFloats);
  }
  for (int64_t j = j_tail; j < j_end; ++j) {
    Finish<MR, 1>(job, i0, j, acc.data() + (full_tiles + j - j_tail) * kTileFloats);
  }
}

// One row of a against one column of w over all of k: both chains in
// registers, the steps in order, so each weight row is read as one
// sequential stream (decode is bound by streaming the weights, and one
// stream a thread is what the hardware prefetchers follow best: eight rows
// side by side, one chain each, ran 0.75-0.9x as fast on AVX2).
template <typename WT>
inline float Row(const float* a, const WT* w, int64_t k) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0;
  int64_t kk = 0;
  for (; kk + kChainStride <= k; kk += kChainStride) {
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + kk), LoadW(w + kk, 8), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + kk + 8), LoadW(w + kk + 8, 8), c1);
  }
  // The last period's steps (up to two, the last one maybe partial), each on its chain.
  if (kk < k) c0 = _mm256_fmadd_ps(simd::LoadPartial(a + kk, k - kk), LoadW(w + kk, k - kk), c0);
  kk += 8;
  if (kk < k) c1 = _mm256_fmadd_ps(simd::LoadPartial(a + kk, k - kk), LoadW(w + kk, k - kk), c1);
  return SumChains(c0, c1);
}

template <typename WT>
void RowTiles(const Job& job, const WT* w, int64_t jb, int64_t je, std::vector<float>& acc) {
  const int64_t m = job.p->m;
  int64_t i = 0;
  for (; i + 3 <= m; i += 3) RowPanel<3, 4>(job, w, i, jb, je, acc);
  if (m - i == 2) RowPanel<2, 6>(job, w, i, jb, je, acc);
  if (m - i == 1) {
    const float* a = job.p->a + i * job.lda;
    for (int64_t j = jb; j < je; ++j) Store(job, i, j, Row(a, w + j * job.ldw, job.p->k));
  }
}

void Columns(const Job& job, int64_t j_begin, int64_t j_end) {
  const MatmulParams& p = *job.p;
  const int64_t nc = ColumnsPerBlock(p.k);
  const bool widen = p.w_bf16 != nullptr && p.m >= kBf16WidenMinRows;
  std::vector<float> widened(widen ? nc * p.k : 0);
  std::vector<float> acc;
  for (int64_t jb = j_begin; jb < j_end; jb += nc) {
    const int64_t je = std::min(j_end, jb + nc);
    if (p.w != nullptr) {
      RowTiles(job, p.w, jb, je, acc);
    } else if (!widen) {
      RowTiles(job, p.w_bf16, jb, je, acc);
    } else {
      // Exact widening into a packed [je - jb, k] block; columns are then
      // addressed relative to jb, so shift the job's view accordingly.
      for (int64_t j = jb; j < je; ++j) {
        const uint16_t* src = p.w_bf16 + j * job.ldw;
        float* dst = widened.data() + (j - jb) * p.k;
        int64_t kk = 0;
        for (; kk + 8 <= p.k; kk += 8) _mm256_storeu_ps(dst + kk, simd::LoadBf16(src + kk));
        if (kk < p.k) simd::StorePartial(dst + kk, simd::LoadBf16Partial(src + kk, p.k - kk), p.k - kk);
      }
      Job packed = job;
      packed.ldw = p.k;
      RowTiles(packed, widened.data() - jb * p.k, jb, je, acc);
    }
  }
}

}  // namespace

// matmul_avx512.cc; the caller has checked the arguments and the CPU.
int MatmulDeterministicAvx512(const MatmulParams* items, int64_t count, bool bf16_dot, ThreadPool* pool);

int MatmulDeterministic(const MatmulParams& p, ThreadPool* pool) {
  return MatmulDeterministicBatchOnPath(&p, 1, ActiveKernelPath(), pool);
}

int MatmulDeterministicOnPath(const MatmulParams& p, KernelPath path, ThreadPool* pool) {
  return MatmulDeterministicBatchOnPath(&p, 1, path, pool);
}

namespace {

// Items of at least this many rows run alone, each in its own parallel
// region: a prefill item's tasks cost m times a decode item's, and one
// region's few chunks over a batch of them left a thread idle at the end
// (Granite MoE bf16 prefill 2048 on 2 threads ran 0.83-0.92x of per-item
// calls). Items of fewer rows (decode: a row or a few per expert) share one
// region, which is what the batch is for. Either way a row's bits are the same.
constexpr int64_t kAloneMinRows = 16;

// The checked items on `path`, in one parallel region.
int RunTogether(const MatmulParams* items, int64_t count, KernelPath path, ThreadPool* pool) {
  if (path != KernelPath::kAvx2) return MatmulDeterministicAvx512(items, count, path == KernelPath::kAvx512Bf16, pool);
  // Each item's columns cut into tasks of kTaskCols; the tasks of all items
  // run in one parallel region (first_task[i] is item i's first task).
  std::vector<Job> jobs(static_cast<size_t>(count));
  std::vector<int64_t> first_task(static_cast<size_t>(count) + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    const MatmulParams& p = items[i];
    jobs[i] = Job{&p, p.lda ? p.lda : p.k, p.ldw ? p.ldw : p.k, p.ldo ? p.ldo : p.n};
    first_task[i + 1] = first_task[i] + (p.n + kTaskCols - 1) / kTaskCols;
  }
  ParallelFor(pool, first_task[count], [&](int64_t begin, int64_t end) {
    int64_t i = std::upper_bound(first_task.begin(), first_task.end(), begin) - first_task.begin() - 1;
    for (; i < count && first_task[i] < end; ++i) {
      const int64_t t0 = std::max(begin, first_task[i]) - first_task[i];
      const int64_t t1 = std::min(end, first_task[i + 1]) - first_task[i];
      if (t0 < t1) Columns(jobs[i], t0 * kTaskCols, std::min(items[i].n, t1 * kTaskCols));
    }
  });
  return kKernelOk;
}

}  // namespace

int MatmulDeterministicBatchOnPath(const MatmulParams* items, int64_t count, KernelPath path, ThreadPool* pool) {
  if (static_cast<int>(path) > static_cast<int>(DetectedKernelPath())) return kKernelUnsupported;
  if (count < 0 || (count > 0 && items == nullptr)) return kKernelInvalidArgument;
  for (int64_t i = 0; i < count; ++i) {
    if (const int status = CheckMatmulParams(items[i]); status != kKernelOk) return status;
  }
  std::vector<MatmulParams> together;
  for (int64_t i = 0; i < count; ++i) {
    if (items[i].m >= kAloneMinRows && count > 1) {
      if (const int status = RunTogether(&items[i], 1, path, pool); status != kKernelOk) return status;
    } else {
      together.push_back(items[i]);
    }
  }
  return RunTogether(together.data(), static_cast<int64_t>(together.size()), path, pool);
}

}  // namespace hybridserve::kernels::cpu
