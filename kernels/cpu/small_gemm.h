#ifndef HYBRIDSERVE_KERNELS_CPU_SMALL_GEMM_H_
#define HYBRIDSERVE_KERNELS_CPU_SMALL_GEMM_H_

// Register-blocked fp32 GEMM for the small in-cache products of the SSD chunk
// scan: c[i, j] = s_i * c[i, j] + sum_kk a[i, kk] * b[kk, j] (row-major a, b, c).
// Internal to kernels/cpu.
//
// Fixed order: every element is one fused multiply-add chain over kk ascending,
// starting from 0 or from s_i * c[i, j]. Row tiles, column tiles and remainder
// paths all run that same chain, so an element's bits depend only on its row of
// a, its column of b and k (and, with `causal`, on its row tile; see below).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/simd.h"

namespace hybridserve::kernels::cpu::small_gemm {

struct Args {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  const float* a = nullptr;  // [m, k], row stride lda
  int64_t lda = 0;
  const float* b = nullptr;  // [k, n], row stride ldb
  int64_t ldb = 0;
  float* c = nullptr;  // [m, n], row stride ldc
  int64_t ldc = 0;
  // false: the chain starts from 0. true: from scale_i * c[i, j] where scale_i is
  // row_scale[i] if row_scale is set, else scale.
  bool load_c = false;
  const float* row_scale = nullptr;  // [m]
  float scale = 1.0f;
  // a is lower triangular (a[i, kk] == 0 for kk > i): a row tile [i0, i0 + MR)
  // stops its chain at kk = min(k, i0 + MR), skipping only zero terms.
  bool causal = false;
};

constexpr int kMaxRows = 6;  // rows per register tile

// Accumulators are named variables (not an array) so that they stay in
// registers: clang keeps an indexed __m256 array on the stack here.
template <int MR, int NV, bool kMasked>
inline void Tile(const Args& g, int64_t i0, int64_t j0, int64_t tail) {
  static_assert(MR >= 1 && MR <= kMaxRows, "row tile");
  static_assert(NV == 1 || NV == 2, "one or two vectors of columns");
  static_assert(!kMasked || NV == 1, "masked tiles are one vector wide");
  const __m256i mask = kMasked ? simd::TailMask(tail) : _mm256_setzero_si256();
  const int64_t lda = g.lda;
  const int64_t ldb = g.ldb;
  const int64_t ldc = g.ldc;
  const float* a = g.a + i0 * lda;
  const float* b = g.b + j0;
  float* c = g.c + i0 * ldc + j0;

  auto load = [&](const float* ptr) { return kMasked ? _mm256_maskload_ps(ptr, mask) : _mm256_loadu_ps(ptr); };
  auto store = [&](float* ptr, __m256 v) {
    if (kMasked) {
      _mm256_maskstore_ps(ptr, mask, v);
    } else {
      _mm256_storeu_ps(ptr, v);
    }
  };
  auto init = [&](int i, int v) {
    if (!g.load_c) return _mm256_setzero_ps();
    const float s = g.row_scale ? g.row_scale[i0 + i] : g.scale;
    return _mm256_mul_ps(_mm256_set1_ps(s), load(c + i * ldc + 8 * v));
  };

  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  c00 = init(0, 0);
  if constexpr (NV > 1) c01 = init(0, 1);
  if constexpr (MR > 1) {
    c10 = init(1, 0);
    if constexpr (NV > 1) c11 = init(1, 1);
  }
  if constexpr (MR > 2) {
    c20 = init(2, 0);
    if constexpr (NV > 1) c21 = init(2, 1);
  }
  if constexpr (MR > 3) {
    c30 = init(3, 0);
    if constexpr (NV > 1) c31 = init(3, 1);
  }
  if constexpr (MR > 4) {
    c40 = init(4, 0);
    if constexpr (NV > 1) c41 = init(4, 1);
  }
  if constexpr (MR > 5) {
    c50 = init(5, 0);
    if constexpr (NV > 1) c51 = init(5, 1);
  }

  const int64_t kend = g.causal ? std::min<int64_t>(g.k, i0 + MR) : g.k;
  for (int64_t kk = 0; kk < kend; ++kk) {
    const float* brow = b + kk * ldb;
    const __m256 b0 = load(brow);
    const __m256 b1 = NV > 1 ? _mm256_loadu_ps(brow + 8) : b0;
    const float* ak = a + kk;
    __m256 av = _mm256_broadcast_ss(ak);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    if constexpr (NV > 1) c01 = _mm256_fmadd_ps(av, b1, c01);
    if constexpr (MR > 1) {
      av = _mm256_broadcast_ss(ak + lda);
      c10 = _mm256_fmadd_ps(av, b0, c10);
      if constexpr (NV > 1) c11 = _mm256_fmadd_ps(av, b1, c11);
    }
    if constexpr (MR > 2) {
      av = _mm256_broadcast_ss(ak + 2 * lda);
      c20 = _mm256_fmadd_ps(av, b0, c20);
      if constexpr (NV > 1) c21 = _mm256_fmadd_ps(av, b1, c21);
    }
    if constexpr (MR > 3) {
      av = _mm256_broadcast_ss(ak + 3 * lda);
      c30 = _mm256_fmadd_ps(av, b0, c30);
      if constexpr (NV > 1) c31 = _mm256_fmadd_ps(av, b1, c31);
    }
    if constexpr (MR > 4) {
      av = _mm256_broadcast_ss(ak + 4 * lda);
      c40 = _mm256_fmadd_ps(av, b0, c40);
      if constexpr (NV > 1) c41 = _mm256_fmadd_ps(av, b1, c41);
    }
    if constexpr (MR > 5) {
      av = _mm256_broadcast_ss(ak + 5 * lda);
      c50 = _mm256_fmadd_ps(av, b0, c50);
      if constexpr (NV > 1) c51 = _mm256_fmadd_ps(av, b1, c51);
    }
  }

  store(c, c00);
  if constexpr (NV > 1) store(c + 8, c01);
  if constexpr (MR > 1) {
    store(c + ldc, c10);
    if constexpr (NV > 1) store(c + ldc + 8, c11);
  }
  if constexpr (MR > 2) {
    store(c + 2 * ldc, c20);
    if constexpr (NV > 1) store(c + 2 * ldc + 8, c21);
  }
  if constexpr (MR > 3) {
    store(c + 3 * ldc, c30);
    if constexpr (NV > 1) store(c + 3 * ldc + 8, c31);
  }
  if constexpr (MR > 4) {
    store(c + 4 * ldc, c40);
    if constexpr (NV > 1) store(c + 4 * ldc + 8, c41);
  }
  if constexpr (MR > 5) {
    store(c + 5 * ldc, c50);
    if constexpr (NV > 1) store(c + 5 * ldc + 8, c51);
  }
}

template <int MR>
inline void RowTile(const Args& g, int64_t i0) {
  int64_t j = 0;
  for (; j + 16 <= g.n; j += 16) Tile<MR, 2, false>(g, i0, j, 0);
  if (j + 8 <= g.n) {
    Tile<MR, 1, false>(g, i0, j, 0);
    j += 8;
  }
  if (j < g.n) Tile<MR, 1, true>(g, i0, j, g.n - j);
}

inline void Gemm(const Args& g) {
  int64_t i = 0;
  for (; i + kMaxRows <= g.m; i += kMaxRows) RowTile<kMaxRows>(g, i);
  switch (g.m - i) {
    case 5:
      RowTile<5>(g, i);
      break;
    case 4:
      RowTile<4>(g, i);
      break;
    case 3:
      RowTile<3>(g, i);
      break;
    case 2:
      RowTile<2>(g, i);
      break;
    case 1:
      RowTile<1>(g, i);
      break;
    default:
      break;
  }
}

}  // namespace hybridserve::kernels::cpu::small_gemm

#endif  // HYBRIDSERVE_KERNELS_CPU_SMALL_GEMM_H_
