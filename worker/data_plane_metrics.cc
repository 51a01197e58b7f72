#include "worker/data_plane_metrics.h"

#include "common/metrics.h"

namespace hybridserve::worker {

DataPlaneMetrics::DataPlaneMetrics(prometheus::Registry& r)
    : bytes_(common::CounterFamily(r, "hybridserve_data_plane_bytes_total",
                                   "Message bytes the data plane's channels moved, by plane, path (device_copy: into "
                                   "the receiver's device memory; socket: over the control connection) and direction")),
      ipc_sent_device_copy_(bytes_.Add({{"plane", "cuda_ipc"}, {"path", "device_copy"}, {"direction", "sent"}})),
      ipc_sent_socket_(bytes_.Add({{"plane", "cuda_ipc"}, {"path", "socket"}, {"direction", "sent"}})),
      ipc_received_device_copy_(
          bytes_.Add({{"plane", "cuda_ipc"}, {"path", "device_copy"}, {"direction", "received"}})),
      ipc_received_socket_(bytes_.Add({{"plane", "cuda_ipc"}, {"path", "socket"}, {"direction", "received"}})) {}

void DataPlaneMetrics::Sync(const transport::IpcTraffic& now) {
  absl::MutexLock lock(&mu_);
  common::AdvanceCounter(ipc_sent_device_copy_, now.sent_by_device_copy, last_.sent_by_device_copy);
  common::AdvanceCounter(ipc_sent_socket_, now.sent_by_socket, last_.sent_by_socket);
  common::AdvanceCounter(ipc_received_device_copy_, now.received_by_device_copy, last_.received_by_device_copy);
  common::AdvanceCounter(ipc_received_socket_, now.received_by_socket, last_.received_by_socket);
  last_ = now;
}

}  // namespace hybridserve::worker
