#ifndef HYBRIDSERVE_KERNELS_KERNEL_STATUS_H_
#define HYBRIDSERVE_KERNELS_KERNEL_STATUS_H_

namespace hybridserve::kernels {

// Return code of every kernel launcher, CPU and CUDA alike. Kernels never
// throw, log or abort on bad input: they check their params struct and return
// one of these; engine/ turns a non-zero code into an absl::Status.
enum KernelStatus : int {
  kKernelOk = 0,
  // A required pointer is null, a shape is non-positive or inconsistent
  // (e.g. n_heads not a multiple of n_groups), or a page/slot index is out of
  // range. Nothing was written.
  kKernelInvalidArgument = 1,
  // A valid request this backend does not implement.
  kKernelUnsupported = 2,
  // The device reported an error (CUDA backend only).
  kKernelDeviceError = 3,
  // Device memory could not be allocated (backend Allocate/UploadConstant).
  kKernelOutOfMemory = 4,
};

inline const char* KernelStatusName(int status) {
  switch (status) {
    case kKernelOk:
      return "ok";
    case kKernelInvalidArgument:
      return "invalid argument";
    case kKernelUnsupported:
      return "unsupported";
    case kKernelDeviceError:
      return "device error";
    case kKernelOutOfMemory:
      return "out of device memory";
    default:
      return "unknown kernel status";
  }
}

}  // namespace hybridserve::kernels

#endif  // HYBRIDSERVE_KERNELS_KERNEL_STATUS_H_
