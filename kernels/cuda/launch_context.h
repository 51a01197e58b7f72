#ifndef HYBRIDSERVE_KERNELS_CUDA_LAUNCH_CONTEXT_H_
#define HYBRIDSERVE_KERNELS_CUDA_LAUNCH_CONTEXT_H_

// What every CUDA launcher needs besides its params struct. Plain C++: callers
// never include CUDA headers, so the stream and the cuBLAS handle travel as
// void*.

#include <cstdint>

namespace hybridserve::kernels {

struct CudaLaunchContext {
  // cudaStream_t every kernel and copy of the call is issued on; null: the
  // legacy default stream.
  void* stream = nullptr;
  // Device int32 (zero at start). Index arrays live in device memory, so a
  // launcher cannot check them on the host: a kernel that meets an index out of
  // range (a token >= vocab, a block-table entry >= num_pages, a state slot >=
  // num_slots) skips that row, writes nothing for it, and stores
  // kKernelInvalidArgument here. The backend reports it at the next
  // Synchronize() or copy to the host. Null: such rows are skipped silently.
  int32_t* error_flag = nullptr;
  // cublasHandle_t bound to `stream`, for MatmulMode::kFast; null: kFast runs
  // the deterministic kernel.
  void* blas = nullptr;
  // Device scratch owned by the backend, reused by every call (calls on one
  // stream run in order, so it is never shared by two running kernels). A
  // launcher that needs more than workspace_bytes works in pieces that fit;
  // launchers never allocate.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_CUDA_LAUNCH_CONTEXT_H_
