#ifndef HYBRIDSERVE_KERNELS_CUDA_DEVICE_PRESENCE_H_
#define HYBRIDSERVE_KERNELS_CUDA_DEVICE_PRESENCE_H_

// Whether a machine has no GPU, told apart from a GPU machine whose CUDA setup
// is broken. Plain C++ (no CUDA headers): the CUDA backend and the NCCL ops
// classify cudaGetDeviceCount's answer with it. "No device" and "no driver"
// are the only answers that mean "no GPU" (tests skip there); every other
// CUDA error is a failure.

namespace hybridserve::kernels::cuda {

// cudaError_t values, fixed by the CUDA runtime's ABI (checked by
// static_assert where CUDA's headers are seen).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorNoDevice = 100;

// Whether the CUDA driver library `soname` loads into this process (dlopen).
// Its absence is the positive sign of "no driver": the runtime's
// cudaErrorInsufficientDriver also means a driver too old for the runtime.
// Thread-safe.
bool CudaDriverLoads(const char* soname = "libcuda.so.1");

// The usable device count from cudaGetDeviceCount's result (`cuda_error`,
// `count`): `count` on success; 0 for "no GPU" (cudaErrorNoDevice) and for
// "no driver" (!driver_loads, whatever the error); otherwise -cuda_error (< 0):
// a machine with a driver whose CUDA setup is broken, a too-old driver included.
int UsableDeviceCount(int cuda_error, int count, bool driver_loads);

}  // namespace hybridserve::kernels::cuda

#endif  // HYBRIDSERVE_KERNELS_CUDA_DEVICE_PRESENCE_H_
