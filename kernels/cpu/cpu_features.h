#ifndef HYBRIDSERVE_KERNELS_CPU_CPU_FEATURES_H_
#define HYBRIDSERVE_KERNELS_CPU_CPU_FEATURES_H_

// Which instruction-set path the CPU kernels take, chosen once per process at
// first use: the best the CPU (and the OS's saved register state) supports,
// or a lower one named by the environment variable HYBRIDSERVE_CPU_PATH
// (avx2 | avx512 | avx512_bf16; a path above what the CPU has is capped to
// the best it has). One binary serves every x86-64-v3 machine.
//
// Results within one path never depend on the batch (the deterministic
// matmul's contract); the paths differ from each other in the last bits (the
// reduction has 8 lanes on AVX2 and 16 on AVX-512, and the avx512_bf16 path
// rounds activations to bf16 for bf16 weights). See kernels/cpu/matmul.h.
//
// Thread-safe.

namespace hybridserve::kernels::cpu {

enum class KernelPath : int {
  kAvx2 = 0,        // AVX2 + FMA + F16C (x86-64-v3): the baseline
  kAvx512 = 1,      // + AVX-512 F/BW/VL: 16-lane matmul, bf16 weights widened
  kAvx512Bf16 = 2,  // + AVX512_BF16: bf16 weights through vdpbf16ps
};

// The best path this CPU supports.
KernelPath DetectedKernelPath();
// The path the kernels use in this process (see above); fixed after the first call.
KernelPath ActiveKernelPath();
// "avx2", "avx512", "avx512_bf16".
const char* KernelPathName(KernelPath path);

}  // namespace hybridserve::kernels::cpu

#endif  // HYBRIDSERVE_KERNELS_CPU_CPU_FEATURES_H_
