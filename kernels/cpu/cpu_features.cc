#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace hybridserve::kernels::cpu {
namespace {

// __builtin_cpu_supports checks CPUID and, for AVX-512, that the OS saves the
// ZMM state (XCR0), so a true answer means the instructions can run.
KernelPath Detect() {
  __builtin_cpu_init();
  const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  if (!avx512) return KernelPath::kAvx2;
  return __builtin_cpu_supports("avx512bf16") ? KernelPath::kAvx512Bf16 : KernelPath::kAvx512;
}

KernelPath Choose() {
  const KernelPath best = Detect();
  const char* want = std::getenv("HYBRIDSERVE_CPU_PATH");
  if (want == nullptr || *want == '\0') return best;
  KernelPath asked = best;
  if (std::strcmp(want, "avx2") == 0) asked = KernelPath::kAvx2;
  if (std::strcmp(want, "avx512") == 0) asked = KernelPath::kAvx512;
  if (std::strcmp(want, "avx512_bf16") == 0) asked = KernelPath::kAvx512Bf16;
  return static_cast<int>(asked) < static_cast<int>(best) ? asked : best;
}

}  // namespace

KernelPath DetectedKernelPath() {
  static const KernelPath path = Detect();
  return path;
}

KernelPath ActiveKernelPath() {
  static const KernelPath path = Choose();
  return path;
}

const char* KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2:
      return "avx2";
    case KernelPath::kAvx512:
      return "avx512";
    case KernelPath::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

}  // namespace hybridserve::kernels::cpu
