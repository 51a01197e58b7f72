#ifndef HYBRIDSERVE_ENGINE_BACKEND_REGISTRY_H_
#define HYBRIDSERVE_ENGINE_BACKEND_REGISTRY_H_

// The one place that maps a device name to a kernels::Backend implementation
// (docs/ARCHITECTURE.md section 1: the engine sees kernels only through the backend
// interface, and this registration point picks cpu or cuda). A new backend
// adds a directory under kernels/ and one case here.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace hybridserve::engine {

enum class Device {
  kCpu = 0,
  kCuda = 1,
};

// "cpu" or "cuda"; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view name);
const char* DeviceName(Device device);

struct BackendOptions {
  Device device = Device::kCpu;
  int num_threads = 2;   // CPU: kernel threads, the calling thread included (>= 1)
  int device_index = 0;  // CUDA: which GPU
};

// A backend for `options.device`. UNIMPLEMENTED, with a message saying why,
// when no such device is present (no GPU, no driver, a device index past the
// last GPU) or it cannot start; INVALID_ARGUMENT for num_threads < 1 or a
// negative device_index.
absl::StatusOr<std::unique_ptr<kernels::Backend>> CreateBackend(const BackendOptions& options);

// OK for kKernelOk, else a status naming `what`: RESOURCE_EXHAUSTED for an
// allocation that did not fit, INTERNAL otherwise (the engine validates its
// inputs, so a kernel that rejects them is an engine bug; a device error is
// not the request's fault either).
absl::Status KernelStatusToStatus(int kernel_status, absl::string_view what);

}  // namespace hybridserve::engine

#endif  // HYBRIDSERVE_ENGINE_BACKEND_REGISTRY_H_
