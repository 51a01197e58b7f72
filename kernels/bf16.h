#ifndef HYBRIDSERVE_KERNELS_BF16_H_
#define HYBRIDSERVE_KERNELS_BF16_H_

// bfloat16 <-> fp32, one element at a time. A bf16 value is held as its bit
// pattern (uint16_t): the high 16 bits of an fp32. Usable from host code and,
// when compiled by nvcc, from device code; plain C++ otherwise (the CUDA
// emulator's host build included).

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HS_BF16_FN __host__ __device__ __forceinline__
#else
#define HS_BF16_FN inline
#endif

namespace hybridserve::kernels {

// Exact: every bf16 value, subnormals, signed zeros, infinities and NaNs
// (payload kept) included.
HS_BF16_FN float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// Rounds to nearest, ties to even. A NaN stays a NaN (its top payload bits
// kept, the quiet bit set); infinities and signed zeros are kept.
HS_BF16_FN uint16_t FloatToBf16(float f) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace hybridserve::kernels

#undef HS_BF16_FN

#endif  // HYBRIDSERVE_KERNELS_BF16_H_
