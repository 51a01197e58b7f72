#ifndef HYBRIDSERVE_KERNELS_CPU_ATTENTION_DOT_H_
#define HYBRIDSERVE_KERNELS_CPU_ATTENTION_DOT_H_

// The attention scores q . k of kernels/cpu/attention.cc, in a header of their
// own so that a test can check the eight-key path against the single-key path
// (internal to the CPU attention kernel; needs AVX2 and FMA).

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/simd.h"

namespace hybridserve::kernels::cpu::attention_internal {

// q . k over head_dim, the one summation order every path uses: one 8-lane
// FMA chain over the head_dim vectors (the last zero-padded), then the lanes
// reduced as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Dot8 computes
// eight keys at once with exactly these operations per key (its hadd tree
// pairs lanes the same way), so a score never depends on its neighbours.
inline __m256 DotLanes(const float* q, const float* k, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  if (i < n) acc = _mm256_fmadd_ps(simd::LoadPartial(q + i, n - i), simd::LoadPartial(k + i, n - i), acc);
  return acc;
}

inline float Dot(const float* q, const float* k, int64_t n) {
  alignas(32) float l[8];
  _mm256_store_ps(l, DotLanes(q, k, n));
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Lane j of the result: the eight lanes of a[j] summed as Dot sums them,
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m256 ReduceEight(const __m256 (&a)[8]) {
  // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7].
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  // [(a0 l0..3), (a1 l0..3), (a2 ..), (a3 ..) | (a0 l4..7), (a1 ..), (a2 ..), (a3 ..)]
  const __m256 q0123 = _mm256_hadd_ps(h01, h23);
  const __m256 q4567 = _mm256_hadd_ps(h45, h67);
  // Low half + high half per vector: a0-a3 from q0123, a4-a7 from q4567.
  const __m256 lo = _mm256_permute2f128_ps(q0123, q4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(q0123, q4567, 0x31);
  return _mm256_add_ps(lo, hi);
}

// Scores of keys k, k + stride, ..., k + 7 * stride against q.
inline __m256 Dot8(const float* q, const float* k, int64_t stride, int64_t n) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * stride + i), a[j]);
  }
  if (i < n) {
    const __m256 qv = simd::LoadPartial(q + i, n - i);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, simd::LoadPartial(k + j * stride + i, n - i), a[j]);
  }
  return ReduceEight(a);
}

// Scores of R query rows (row r at q + r * q_stride) against the same `count`
// keys of a block: scores[r * ld + i] = (q_r . k_i) * scale. The rows of a GQA
// group share their keys, so R rows x (8 / R) keys are computed together and
// each key vector loaded once serves R rows (Dot8 loads eight keys for one
// row). Every score still has the bits of Dot(q_r, k_i, n) * scale: each (row,
// key) pair is its own 8-lane FMA chain over the same head_dim vectors, reduced
// by ReduceEight. R divides 8.
template <int R>
inline void ScoreKeysRows(const float* q, int64_t q_stride, const float* k, int64_t stride, int64_t n, int64_t count,
                          float scale, float* scores, int64_t ld) {
  static_assert(R == 1 || R == 2 || R == 4 || R == 8, "R rows x 8 / R keys fill eight accumulators");
  constexpr int K = 8 / R;
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + K <= count; i += K) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
    const float* kb = k + i * stride;
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) {
      __m256 kv[K];
#pragma unroll
      for (int j = 0; j < K; ++j) kv[j] = _mm256_loadu_ps(kb + j * stride + d);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * q_stride + d);
#pragma unroll
        for (int j = 0; j < K; ++j) a[r * K + j] = _mm256_fmadd_ps(qv, kv[j], a[r * K + j]);
      }
    }
    if (d < n) {
      __m256 kv[K];
#pragma unroll
      for (int j = 0; j < K; ++j) kv[j] = simd::LoadPartial(kb + j * stride + d, n - d);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const __m256 qv = simd::LoadPartial(q + r * q_stride + d, n - d);
#pragma unroll
        for (int j = 0; j < K; ++j) a[r * K + j] = _mm256_fmadd_ps(qv, kv[j], a[r * K + j]);
      }
    }
    alignas(32) float sums[8];
    _mm256_store_ps(sums, _mm256_mul_ps(ReduceEight(a), vscale));
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int j = 0; j < K; ++j) scores[r * ld + i + j] = sums[r * K + j];
    }
  }
  for (; i < count; ++i) {
    for (int r = 0; r < R; ++r) scores[r * ld + i] = Dot(q + r * q_stride, k + i * stride, n) * scale;
  }
}

// scores[i] = (q . k_i) * scale for the `count` keys k_i = k + i * stride of
// one block: ScoreKeysRows for one row, eight keys at a time (Dot8's
// arithmetic), the last count % 8 with Dot. Every score has the bits of
// Dot(q, k_i, n) * scale. `scores` holds at least count floats.
inline void ScoreKeys(const float* q, const float* k, int64_t stride, int64_t n, int64_t count, float scale,
                      float* scores) {
  ScoreKeysRows<1>(q, /*q_stride=*/0, k, stride, n, count, scale, scores, /*ld=*/0);
}

}  // namespace hybridserve::kernels::cpu::attention_internal

#endif  // HYBRIDSERVE_KERNELS_CPU_ATTENTION_DOT_H_
