#ifndef HYBRIDSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define HYBRIDSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

// The CUDA implementation of kernels::Backend: device memory from cudaMalloc,
// every kernel and copy on one non-blocking stream of the chosen GPU, the
// launchers of kernels/cuda/launchers.h. Built twice like the kernels:
// cuda::CreateCudaBackend runs on a GPU, cuda_emu::CreateCudaBackend on the
// CUDA emulator (tests on machines without a GPU).
//
// Memory: Allocate returns zero-filled device memory (256-byte aligned);
// UploadConstant copies to device memory (the host bytes may go right after);
// HostAddress is null (the host copies); CopyToDevice from pageable host
// memory returns once the source has been read; CopyToHost waits for the
// stream. Copies check that device ranges lie inside live buffers of this
// backend (kKernelInvalidArgument otherwise).
//
// Index arrays (tokens, block tables, slots) live in device memory, so a
// kernel that meets one out of range skips that row and raises a device flag;
// the next Synchronize() or CopyToHost() returns kKernelInvalidArgument and
// clears it (kernels/cuda/launch_context.h).
//
// MatmulMode::kFast uses cuBLAS (bf16 tensor cores for bf16 weights, TF32
// off: fp32 weights run in fp32); kDeterministic the batch-invariant kernel.
//
// Shared memory: peer_memory() is CUDA IPC (kernels/peer_memory.h), on a
// stream of its own.
//
// Thread safety: as kernels::Backend (one caller at a time); its peer_memory()
// is thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace hybridserve::kernels {

struct CudaBackendOptions {
  int device_index = 0;
  // Scratch shared by the kernels of a call (split-k partials, bf16 copies of
  // activations for cuBLAS): allocated once at creation.
  int64_t workspace_bytes = int64_t{64} << 20;
  // MatmulMode::kFast through cuBLAS; false: kFast runs the deterministic kernel.
  bool use_cublas = true;
};

namespace cuda {
// Number of usable GPUs: 0 when there is no driver or no GPU; the negated
// cudaError_t for a machine whose CUDA setup is broken.
int CudaDeviceCount();
// A backend on options.device_index, or null with *error saying why (no GPU,
// no such device, out of memory, ...).
std::unique_ptr<Backend> CreateCudaBackend(const CudaBackendOptions& options, std::string* error);
}  // namespace cuda

namespace cuda_emu {
int CudaDeviceCount();  // always 1
std::unique_ptr<Backend> CreateCudaBackend(const CudaBackendOptions& options, std::string* error);
}  // namespace cuda_emu

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
