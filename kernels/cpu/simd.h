#ifndef HYBRIDSERVE_KERNELS_CPU_SIMD_H_
#define HYBRIDSERVE_KERNELS_CPU_SIMD_H_

// AVX2/FMA building blocks shared by the CPU kernels (x86-64-v3 only). Every
// helper has one fixed arithmetic, so a value computed through it has the same
// bits wherever it is used. Internal to kernels/cpu.

#include <immintrin.h>

#include <cstdint>

namespace hybridserve::kernels::cpu::simd {

// Sum of the 8 lanes in a fixed tree: (l0+l4, l1+l5, l2+l6, l3+l7), then
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float Hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane mask with the first `n` (0..8) lanes set, for maskload/maskstore.
inline __m256i TailMask(int64_t n) {
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n));
}

// Loads n (0..8) floats, zero in the other lanes.
inline __m256 LoadPartial(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, TailMask(n));
}

inline void StorePartial(float* p, __m256 v, int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, TailMask(n), v);
  }
}

// 8 bfloat16 bit patterns widened exactly to fp32.
inline __m256 LoadBf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 LoadBf16Partial(const uint16_t* p, int64_t n) {
  if (n >= 8) return LoadBf16(p);
  alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) tmp[i] = p[i];
  return LoadBf16(tmp);
}

// |x[0, n)|^2 in one fixed order: 8 lanes of fused multiply-adds over i
// ascending (lane i % 8, the last step zero-padded), then Hsum's fixed tree.
// The RMS norms and Gated DeltaNet's L2 norm share it.
inline float SumOfSquares(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  if (i < n) {
    const __m256 v = LoadPartial(x + i, n - i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  return Hsum(acc);
}

// exp(x) for 8 lanes, Cephes-style: range reduction by ln 2 in two parts and a
// degree-6 polynomial; about 1 ulp on [-87.3, 88.3]. Lanes below ln(FLT_MIN)
// (including -inf) give +0, lanes above 88.376 give the value at 88.376,
// NaN stays NaN.
inline __m256 Exp(__m256 x) {
  const __m256 kHi = _mm256_set1_ps(88.3762626647949f);
  const __m256 kLo = _mm256_set1_ps(-87.3365478515625f);
  const __m256 underflow = _mm256_cmp_ps(x, kLo, _CMP_LT_OQ);
  // Operands ordered so that a NaN lane stays NaN.
  x = _mm256_min_ps(kHi, x);
  x = _mm256_max_ps(kLo, x);
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(fx, _mm256_set1_ps(-0.693359375f), x);
  r = _mm256_fmadd_ps(fx, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, y);
}

}  // namespace hybridserve::kernels::cpu::simd

#endif  // HYBRIDSERVE_KERNELS_CPU_SIMD_H_
