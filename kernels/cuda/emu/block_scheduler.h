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
// must serialize RunGrid process-wide: a kernel's __shared__ variables are one
// static copy, shared by every host thread.

#include <cstddef>
#include <functional>

#include "kernels/cuda/emu/cuda_emu.h"

namespace hybridserve::kernels::cuda_emu::internal {

// Writes "cuda_emu: <message>" to stderr and aborts: a kernel's fault or an
// emulator limit, not an error a caller can handle.
[[noreturn]] void Fatal(const char* format, ...) __attribute__((format(printf, 1, 2)));

// True while RunGrid runs on this host thread (that is, inside a kernel).
bool InKernel();

// Runs `body` once per thread of every block of `grid`, blocks in x, y, z
// order, with threadIdx, blockIdx, blockDim and gridDim set and
// DynamicSharedMemory() pointing at `smem_bytes` bytes filled with 0xFF before
// each block, and every __shared__ variable (cuda_emu.h) filled so too; resets them on return. `kernel` names the
// function in fault messages. Preconditions: the configuration passed the runtime's launch checks (block.x * block.y *
// block.z a multiple of 32, at most 1024), and the caller holds the process-wide launch lock. Aborts on a deadlock, a
// divergent warp collective, or when called inside a kernel.
void RunGrid(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

}  // namespace hybridserve::kernels::cuda_emu::internal

#endif  // HYBRIDSERVE_KERNELS_CUDA_EMU_BLOCK_SCHEDULER_H_
