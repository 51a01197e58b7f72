#include "kernels/cuda/device_presence.h"

#include <dlfcn.h>

namespace hybridserve::kernels::cuda {

bool CudaDriverLoads(const char* soname) {
  void* handle = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

int UsableDeviceCount(int cuda_error, int count, bool driver_loads) {
  if (cuda_error == kCudaSuccess) return count;
  if (cuda_error == kCudaErrorNoDevice || !driver_loads) return 0;
  return -cuda_error;
}

}  // namespace hybridserve::kernels::cuda
