#ifndef HYBRIDSERVE_KERNELS_CUDA_EMU_BLOCK_SCHEDULER_H_
#define HYBRIDSERVE_KERNELS_CUDA_EMU_BLOCK_SCHEDULER_H_

// The CUDA emulator's execution of a grid, internal to kernels/cuda/emu (the
// runtime of cuda_emu.cc is its only caller). RunGrid runs the blocks one after
// another on the calling host thread, the threads of a block as fibers (an
// x86-64 stack switch, no syscall, ASan-annotated) that switch only at
// __syncthreads(), at warp collectives and at exit. The .cc also defines the
// device side declared in cuda_emu.h (threadIdx, blockIdx, blockDim, gridDim,
// DynamicSharedMemory, __syncthreads, __syncwarp, detail::WarpExchange), which
// act on the grid running on the calling host thread and abort outside one.
//
// Thread safety: fibers and the running grid are per host thread, but callers
// must serialize RunGrid process-wide (the stream queues' lock does:
// stream_queues.h): a kernel's __shared__ variables are one static copy,
// shared by every host thread.

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cuda/emu/cuda_emu.h"

namespace hybridserve::kernels::cuda_emu::internal {

// Writes "cuda_emu: <message>" to stderr and aborts: a kernel's fault or an
// emulator limit, not an error a caller can handle.
[[noreturn]] void Fatal(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The seed of the emulator's pseudo-random orders: HS_CUDA_EMU_SEED (an
// unsigned integer, decimal or 0x-hex; a malformed value aborts), or
// kDefaultSeed when unset.
inline constexpr uint64_t kDefaultSeed = 0x9e3779b97f4a7c15u;
uint64_t SeedFromEnvironment();

// splitmix64: a fast, well-mixed 64-bit generator; enough for the orders.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0 (Lemire's multiply-shift; the bias is < n / 2^64).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>((static_cast<unsigned __int128>(Next()) * n) >> 64); }

 private:
  uint64_t state_;
};

// True while RunGrid runs on this host thread (that is, inside a kernel).
bool InKernel();

// Runs `body` once per thread of every block of `grid`, blocks in x, y, z
// order, with threadIdx, blockIdx, blockDim and gridDim set and
// DynamicSharedMemory() pointing at `smem_bytes` bytes filled with 0xFF before
// each block, and every __shared__ variable (cuda_emu.h) filled so too; resets them on return. `kernel` names the
// function in fault messages. Preconditions: the configuration passed the runtime's launch checks (block.x * block.y *
// block.z a multiple of 32, at most 1024), and the caller holds the process-wide launch lock (stream_queues.h's).
// Aborts on a deadlock, a divergent warp collective, or when called inside a kernel.
void RunGrid(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

}  // namespace hybridserve::kernels::cuda_emu::internal

#endif  // HYBRIDSERVE_KERNELS_CUDA_EMU_BLOCK_SCHEDULER_H_
