#ifndef HYBRIDSERVE_KERNELS_CUDA_GPU_REQUIREMENT_H_
#define HYBRIDSERVE_KERNELS_CUDA_GPU_REQUIREMENT_H_

// How a GPU test that finds too few GPUs ends: skipped, or failed on a run
// that declares its GPUs. Test-only.
//
// HS_REQUIRE_GPUS=N declares a machine with N GPUs (the GPU bundle's run.sh,
// tools/gpu_bundle/run.sh, sets it): there a test that needs at most N GPUs and
// finds fewer FAILS instead of skipping, so a GPU run cannot pass by skipping.
// Unset or 0: such a test skips, saying so.

namespace hybridserve::kernels::cuda_testing {

// HS_REQUIRE_GPUS as a count: 0 when unset or empty; a value that is not a
// non-negative integer fails the current test and counts as 0.
int RequiredGpus();

// For a test that needs `needed` GPUs where the device count said `found`
// (< 0: the negated CUDA error of a broken setup). True when found >= needed.
// Otherwise false, after recording why: a fatal failure when found < 0 or
// when HS_REQUIRE_GPUS >= needed, else GTEST_SKIP with `why` (may be null)
// appended. The caller returns at once on false, as after GTEST_SKIP().
bool HaveGpusOrSkip(int needed, int found, const char* why = nullptr);

}  // namespace hybridserve::kernels::cuda_testing

#endif  // HYBRIDSERVE_KERNELS_CUDA_GPU_REQUIREMENT_H_
