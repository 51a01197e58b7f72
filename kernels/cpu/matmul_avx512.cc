// Deterministic matmul on AVX-512 (16 fp32 lanes) and AVX512_BF16 (vdpbf16ps).
// Compiled for the baseline (x86-64-v3) like every other file; only the
// functions between the clang attribute pragmas carry the AVX-512 target, and
// they run only when ActiveKernelPath() says the CPU has it. Nothing here is
// an inline function shared with other files (no ODR mix of instruction sets).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernel_status.h"

namespace hybridserve::kernels::cpu {
namespace {

// Bytes of weights per cache block: a block of columns (all of k) stays in L2
// while every row tile of a streams past it.
constexpr int64_t kBlockBytes = 384 * 1024;
// k per block, a multiple of 32 (one vdpbf16ps step): the a panel of a row tile
// stays in L1 across the column tiles of a block.
constexpr int64_t kKc = 1024;
static_assert(kKc % 32 == 0, "k blocks must keep the lane summation order");
// Columns per parallel task: a multiple of every tile width (4, 6, 8).
constexpr int64_t kTaskCols = 24;
// From this many rows on, each column block's weights are packed into tiles
// (PackTiles) before the row panels run over them.
constexpr int64_t kPackMinRows = 128;
// Floats of accumulators per tile element.
constexpr int kLanes = 16;

// The operand types of one kernel family.
//   F32:  a fp32, w fp32;        lane l sums k = l mod 16 (fma, ascending k).
//   Wide: a fp32, w bf16 widened exactly; the same chain as F32.
//   Dot:  a bf16 (rounded to nearest even), w bf16; lane l holds the pairs
//         k = 2l, 2l + 1 (mod 32), each vdpbf16ps step adding the odd product,
//         then the even one, to it (Intel's definition).
enum class Kind { kF32, kWide, kDot };

struct Job {
  const MatmulParams* p;
  const void* a;  // fp32 rows of p.a, or their bf16 copy (kDot)
  int64_t lda, ldw, ldo;
};

int64_t ColumnsPerBlock(int64_t k, int64_t weight_bytes) {
  const int64_t cols = kBlockBytes / (weight_bytes * std::max<int64_t>(k, 1));
  return std::max<int64_t>(kTaskCols, cols / kTaskCols * kTaskCols);
}

#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), \
                             apply_to = function)

inline __mmask16 Mask16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask32 Mask32(int64_t n) { return static_cast<__mmask32>((uint64_t{1} << n) - 1u); }

inline __m512 LoadF32(const float* p, int64_t rem) {
  return rem >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(Mask16(rem), p);
}
inline __m512 LoadWide(const uint16_t* p, int64_t rem) {
  const __m256i h =
      rem >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(Mask16(rem), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512i LoadPairs(const uint16_t* p, int64_t rem) {
  return rem >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(Mask32(rem), p);
}

// 16 lanes in a fixed tree: lanes i and i + 8 first, then simd::Hsum's tree.
inline float Hsum16(__m512 v) {
  return simd::Hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// One step of the chain over [kk, kk + step) (rem = elements left, may be < step).
template <Kind K>
struct Step;

template <>
struct Step<Kind::kF32> {
  static constexpr int64_t kStep = 16;
  using A = float;
  using W = float;
  using Vec = __m512;
  static Vec LoadA(const float* p, int64_t rem) { return LoadF32(p, rem); }
  static Vec LoadW(const float* p, int64_t rem) { return LoadF32(p, rem); }
  static __m512 Madd(__m512 acc, Vec a, Vec w) { return _mm512_fmadd_ps(a, w, acc); }
};

template <>
struct Step<Kind::kWide> {
  static constexpr int64_t kStep = 16;
  using A = float;
  using W = uint16_t;
  using Vec = __m512;
  static Vec LoadA(const float* p, int64_t rem) { return LoadF32(p, rem); }
  static Vec LoadW(const uint16_t* p, int64_t rem) { return LoadWide(p, rem); }
  static __m512 Madd(__m512 acc, Vec a, Vec w) { return _mm512_fmadd_ps(a, w, acc); }
};

template <>
struct Step<Kind::kDot> {
  static constexpr int64_t kStep = 32;
  using A = uint16_t;
  using W = uint16_t;
  using Vec = __m512i;
  static Vec LoadA(const uint16_t* p, int64_t rem) { return LoadPairs(p, rem); }
  static Vec LoadW(const uint16_t* p, int64_t rem) { return LoadPairs(p, rem); }
  static __m512 Madd(__m512 acc, Vec a, Vec w) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)w); }
};

// Accumulates rows [0, MR) of a against columns [0, NR) of w over k in
// [k_begin, k_end) (k_begin a multiple of the step) into acc_io (MR * NR vectors).
// Column j's elements [kk, kk + step) are at w + j * ldw + (kk / step) * wss:
// wss = step for w as stored (row stride ldw), or a packed tile (ldw = step,
// wss = NR * step: the tile's columns interleaved a step at a time, one stream).
template <Kind K, int MR, int NR>
inline void MicroKernel(const typename Step<K>::A* a, int64_t lda, const typename Step<K>::W* w, int64_t ldw,
                        int64_t wss, int64_t k_begin, int64_t k_end, bool load_acc, float* acc_io) {
  using S = Step<K>;
  __m512 acc[MR * NR];
#pragma unroll
  for (int t = 0; t < MR * NR; ++t) acc[t] = load_acc ? _mm512_loadu_ps(acc_io + kLanes * t) : _mm512_setzero_ps();
  int64_t kk = k_begin;
  for (; kk + S::kStep <= k_end; kk += S::kStep) {
    // Decode streams NR weight rows at once (MR rows of a: one per batch
    // row, up to 6). Each step fetches, into L2, the same step of the next
    // tile's NR rows (the rows this thread reads next: NR * ldw elements
    // ahead), so a tile's rows are in L2 from their first byte. (A prefetch
    // 1 KiB ahead in a tile's own rows, single rows only, left each row's
    // first KiB to the hardware, half of a 1024-wide bf16 row: the bf16
    // matrix-vector product ran at 0.53-0.69x a streaming read of its weights
    // from memory, now 0.87-0.91x; bench/kernels/matmul_bench.) Packed tiles
    // (wss != step) are one stream each: a single row fetches 1 KiB ahead in
    // it. No effect on the arithmetic; a prefetch never faults.
    if ((kk * static_cast<int64_t>(sizeof(typename S::W))) % 64 == 0) {
      if (wss == S::kStep) {
#pragma unroll
        for (int j = 0; j < NR; ++j) {
          const auto next = reinterpret_cast<uintptr_t>(w) + ((j + NR) * ldw + kk) * sizeof(typename S::W);
          _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
        }
      } else if (MR == 1) {
#pragma unroll
        for (int j = 0; j < NR; ++j) {
          _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + kk / S::kStep * wss) + 1024, _MM_HINT_T0);
        }
      }
    }
    typename S::Vec av[MR];
#pragma unroll
    for (int i = 0; i < MR; ++i) av[i] = S::LoadA(a + i * lda + kk, S::kStep);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const typename S::Vec wv = S::LoadW(w + j * ldw + kk / S::kStep * wss, S::kStep);
#pragma unroll
      for (int i = 0; i < MR; ++i) acc[i * NR + j] = S::Madd(acc[i * NR + j], av[i], wv);
    }
  }
  if (kk < k_end) {
    const int64_t rem = k_end - kk;
    typename S::Vec av[MR];
#pragma unroll
    for (int i = 0; i < MR; ++i) av[i] = S::LoadA(a + i * lda + kk, rem);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const typename S::Vec wv = S::LoadW(w + j * ldw + kk / S::kStep * wss, rem);
#pragma unroll
      for (int i = 0; i < MR; ++i) acc[i * NR + j] = S::Madd(acc[i * NR + j], av[i], wv);
    }
  }
#pragma unroll
  for (int t = 0; t < MR * NR; ++t) _mm512_storeu_ps(acc_io + kLanes * t, acc[t]);
}

template <int MR, int NR>
inline void Finish(const Job& job, int64_t i0, int64_t j0, const float* acc_io) {
  const MatmulParams& p = *job.p;
  for (int i = 0; i < MR; ++i) {
    float* out = p.out + (i0 + i) * job.ldo + j0;
    for (int j = 0; j < NR; ++j) {
      float r = Hsum16(_mm512_loadu_ps(acc_io + kLanes * (i * NR + j)));
      if (p.bias != nullptr) r = r + p.bias[j0 + j];
      if (p.accumulate) r = out[j] + r;
      out[j] = r;
    }
  }
}

// Rows [i0, i0 + MR) x columns [j_begin, j_end) of one column block: tiles of
// NR columns, then single columns. k blocks are the outer loop (the a panel
// stays in L1 across the tiles); a single row runs each tile over all of k
// (one long stream per weight row). With `packed` (a copy of the block's full
// tiles made by PackTiles), the tiles read from it: the same elements in the
// same order, so the same bits. The chain per element is the same in every
// case: kKc is a multiple of the step.
template <Kind K, int MR, int NR>
void RowPanel(const Job& job, int64_t i0, int64_t j_begin, int64_t j_end, const typename Step<K>::W* packed,
              std::vector<float>& acc) {
  using S = Step<K>;
  const MatmulParams& p = *job.p;
  const auto* a = static_cast<const typename S::A*>(job.a) + i0 * job.lda;
  const auto* w = reinterpret_cast<const typename S::W*>(p.w != nullptr ? static_cast<const void*>(p.w)
                                                                        : static_cast<const void*>(p.w_bf16));
  const int64_t full_tiles = (j_end - j_begin) / NR;
  const int64_t j_tail = j_begin + full_tiles * NR;
  const int64_t tiles = full_tiles + (j_end - j_tail);
  const int64_t steps = (p.k + S::kStep - 1) / S::kStep;
  constexpr int64_t kTileFloats = MR * NR * kLanes;
  if (static_cast<int64_t>(acc.size()) < tiles * kTileFloats) acc.resize(tiles * kTileFloats);
  const int64_t k_step = MR == 1 ? std::max<int64_t>(p.k, 1) : kKc;
  for (int64_t k0 = 0; k0 == 0 || k0 < p.k; k0 += k_step) {  // k == 0: zeros
    const int64_t k1 = std::min(p.k, k0 + k_step);
    for (int64_t t = 0; t < full_tiles; ++t) {
      float* tile_acc = acc.data() + t * kTileFloats;
      if (packed != nullptr) {
        MicroKernel<K, MR, NR>(a, job.lda, packed + t * steps * NR * S::kStep, S::kStep, NR * S::kStep, k0, k1, k0 > 0,
                               tile_acc);
      } else {
        MicroKernel<K, MR, NR>(a, job.lda, w + (j_begin + t * NR) * job.ldw, job.ldw, S::kStep, k0, k1, k0 > 0,
                               tile_acc);
      }
    }
    for (int64_t j = j_tail; j < j_end; ++j) {
      MicroKernel<K, MR, 1>(a, job.lda, w + j * job.ldw, job.ldw, S::kStep, k0, k1, k0 > 0,
                            acc.data() + (full_tiles + j - j_tail) * kTileFloats);
    }
  }
  for (int64_t t = 0; t < full_tiles; ++t) Finish<MR, NR>(job, i0, j_begin + t * NR, acc.data() + t * kTileFloats);
  for (int64_t j = j_tail; j < j_end; ++j) {
    Finish<MR, 1>(job, i0, j, acc.data() + (full_tiles + j - j_tail) * kTileFloats);
  }
}

// Copies the full tiles of NR columns of [j_begin, j_end) into `out`: tile t,
// step s, column c at out[((t * steps + s) * NR + c) * step], the step's
// elements of that column, zero-padded past k (what a masked load reads).
template <Kind K, int NR>
void PackTiles(const Job& job, int64_t j_begin, int64_t j_end, std::vector<typename Step<K>::W>& out) {
  using S = Step<K>;
  using W = typename S::W;
  const MatmulParams& p = *job.p;
  const W* w =
      reinterpret_cast<const W*>(p.w != nullptr ? static_cast<const void*>(p.w) : static_cast<const void*>(p.w_bf16));
  const int64_t tiles = (j_end - j_begin) / NR;
  const int64_t steps = (p.k + S::kStep - 1) / S::kStep;
  const auto size = static_cast<size_t>(tiles * steps * NR * S::kStep);
  if (out.size() < size) out.resize(size);
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t c = 0; c < NR; ++c) {
      const W* src = w + (j_begin + t * NR + c) * job.ldw;
      for (int64_t st = 0; st < steps; ++st) {
        W* dst = out.data() + ((t * steps + st) * NR + c) * S::kStep;
        const int64_t n = std::min<int64_t>(S::kStep, p.k - st * S::kStep);
        std::copy(src + st * S::kStep, src + st * S::kStep + n, dst);
        std::fill(dst + n, dst + S::kStep, W{0});
      }
    }
  }
}

template <Kind K>
void Columns(const Job& job, int64_t j_begin, int64_t j_end) {
  // Accumulators of the tiles of one row panel and the packed weight block,
  // kept per thread across calls (no allocation once warm).
  thread_local std::vector<float> acc;
  thread_local std::vector<typename Step<K>::W> packed;
  const MatmulParams& p = *job.p;
  const int64_t nc = ColumnsPerBlock(p.k, p.w != nullptr ? 4 : 2);
  for (int64_t jb = j_begin; jb < j_end; jb += nc) {
    const int64_t je = std::min(j_end, jb + nc);
    int64_t i = 0;
    if (p.m >= kPackMinRows) {
      // Many row panels share the block: one contiguous stream per tile
      // instead of NR weight rows (the hardware prefetchers follow few
      // streams). 6 x 4 tiles: 24 accumulators, 6 activation vectors and a
      // weight vector, 31 of the 32 registers.
      PackTiles<K, 4>(job, jb, je, packed);
      for (; i + 6 <= p.m; i += 6) RowPanel<K, 6, 4>(job, i, jb, je, packed.data(), acc);
      if (p.m - i >= 4) {
        RowPanel<K, 4, 4>(job, i, jb, je, packed.data(), acc);
        i += 4;
      }
      if (p.m - i == 3) RowPanel<K, 3, 4>(job, i, jb, je, packed.data(), acc);
      if (p.m - i == 2) RowPanel<K, 2, 4>(job, i, jb, je, packed.data(), acc);
      if (p.m - i == 1) RowPanel<K, 1, 4>(job, i, jb, je, packed.data(), acc);
      continue;
    }
    for (; i + 6 <= p.m; i += 6) RowPanel<K, 6, 4>(job, i, jb, je, nullptr, acc);
    if (p.m - i >= 4) {
      RowPanel<K, 4, 6>(job, i, jb, je, nullptr, acc);
      i += 4;
    }
    if (p.m - i == 3) RowPanel<K, 3, 8>(job, i, jb, je, nullptr, acc);
    if (p.m - i == 2) RowPanel<K, 2, 8>(job, i, jb, je, nullptr, acc);
    if (p.m - i == 1) RowPanel<K, 1, 8>(job, i, jb, je, nullptr, acc);
  }
}

// Rows [begin, end) of a (fp32, stride lda) to bf16, round to nearest even
// (vcvtneps2bf16), into dst (stride k).
void RoundRowsToBf16(const float* a, int64_t lda, int64_t k, int64_t begin, int64_t end, uint16_t* dst) {
  for (int64_t i = begin; i < end; ++i) {
    const float* src = a + i * lda;
    uint16_t* out = dst + i * k;
    for (int64_t kk = 0; kk < k; kk += 16) {
      const int64_t n = std::min<int64_t>(16, k - kk);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(Mask16(n), src + kk));
      _mm256_mask_storeu_epi16(out + kk, Mask16(n), (__m256i)h);
    }
  }
}

#pragma clang attribute pop

}  // namespace

int MatmulDeterministicAvx512(const MatmulParams* items, int64_t count, bool bf16_dot, ThreadPool* pool) {
  // Each item's columns cut into tasks of kTaskCols; the tasks of all items
  // run in one parallel region, item after item (first_task[i] is item i's
  // first task).
  std::vector<Job> jobs(static_cast<size_t>(count));
  std::vector<int64_t> first_task(static_cast<size_t>(count) + 1, 0);
  // bf16 copies of the items' activations (kDot), kept per calling thread
  // across calls; first_row[i] is item i's first row in it.
  thread_local std::vector<uint16_t> a_bf16;
  std::vector<int64_t> first_elem(static_cast<size_t>(count) + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    const MatmulParams& p = items[i];
    jobs[i] = Job{&p, p.a, p.lda ? p.lda : p.k, p.ldw ? p.ldw : p.k, p.ldo ? p.ldo : p.n};
    first_task[i + 1] = first_task[i] + (p.n + kTaskCols - 1) / kTaskCols;
    first_elem[i + 1] = first_elem[i] + (bf16_dot && p.w_bf16 != nullptr ? p.m * p.k : 0);
  }
  if (first_elem[count] > 0) {
    // The activations rounded to bf16 once per call (each row on its own, so
    // a row's bf16 copy does not depend on the others).
    if (static_cast<int64_t>(a_bf16.size()) < first_elem[count]) a_bf16.resize(first_elem[count]);
    for (int64_t i = 0; i < count; ++i) {
      const MatmulParams& p = items[i];
      if (first_elem[i + 1] == first_elem[i]) continue;
      uint16_t* dst = a_bf16.data() + first_elem[i];
      const int64_t lda = jobs[i].lda;
      ParallelFor(pool, p.m, [&](int64_t begin, int64_t end) { RoundRowsToBf16(p.a, lda, p.k, begin, end, dst); });
      jobs[i].a = dst;
      jobs[i].lda = p.k;
    }
  }
  ParallelFor(pool, first_task[count], [&](int64_t begin, int64_t end) {
    // The items whose tasks overlap [begin, end), each over its columns there.
    int64_t i = std::upper_bound(first_task.begin(), first_task.end(), begin) - first_task.begin() - 1;
    for (; i < count && first_task[i] < end; ++i) {
      const Job& job = jobs[i];
      const MatmulParams& p = *job.p;
      const int64_t t0 = std::max(begin, first_task[i]) - first_task[i];
      const int64_t t1 = std::min(end, first_task[i + 1]) - first_task[i];
      if (t0 >= t1) continue;
      const int64_t j0 = t0 * kTaskCols;
      const int64_t j1 = std::min(p.n, t1 * kTaskCols);
      if (p.w != nullptr) {
        Columns<Kind::kF32>(job, j0, j1);
      } else if (!bf16_dot) {
        Columns<Kind::kWide>(job, j0, j1);
      } else {
        Columns<Kind::kDot>(job, j0, j1);
      }
    }
  });
  return kKernelOk;
}

}  // namespace hybridserve::kernels::cpu
