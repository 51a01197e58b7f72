#include "engine/backend_registry.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/cpu/cpu_backend.h"  // with cuda_backend.h: the only engine files that name backend implementations
#include "kernels/cuda/cuda_backend.h"

namespace hybridserve::engine {

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("unknown device \"", name, "\": expected \"cpu\" or \"cuda\""));
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<kernels::Backend>> CreateBackend(const BackendOptions& options) {
  switch (options.device) {
    case Device::kCpu:
      if (options.num_threads < 1) {
        return absl::InvalidArgumentError(absl::StrCat("num_threads ", options.num_threads, " < 1"));
      }
      {
        auto backend = std::make_unique<kernels::cpu::CpuBackend>(options.num_threads);
        // Once per process: the kernel path is fixed at first use.
        static const bool logged = [&] {
          LOG(INFO) << "cpu kernels: " << backend->variant() << " path (" << options.num_threads
                    << " threads; HYBRIDSERVE_CPU_PATH=avx2|avx512|avx512_bf16 chooses a lower one)";
          return true;
        }();
        (void)logged;
        return std::unique_ptr<kernels::Backend>(std::move(backend));
      }
    case Device::kCuda: {
      if (options.device_index < 0) {
        return absl::InvalidArgumentError(absl::StrCat("device_index ", options.device_index, " < 0"));
      }
      kernels::CudaBackendOptions cuda_options;
      cuda_options.device_index = options.device_index;
      std::string error;
      std::unique_ptr<kernels::Backend> backend = kernels::cuda::CreateCudaBackend(cuda_options, &error);
      if (backend == nullptr) {
        return absl::UnimplementedError(absl::StrCat("the cuda backend cannot start: ", error, "; use --device=cpu"));
      }
      static const bool logged = [&] {
        LOG(INFO) << "cuda kernels: " << backend->variant() << " (device " << options.device_index << ")";
        return true;
      }();
      (void)logged;
      return backend;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown device ", static_cast<int>(options.device)));
}

absl::Status KernelStatusToStatus(int kernel_status, absl::string_view what) {
  if (kernel_status == kernels::kKernelOk) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, " failed: ", kernels::KernelStatusName(kernel_status), " (kernel status ", kernel_status, ")");
  if (kernel_status == kernels::kKernelOutOfMemory) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace hybridserve::engine
