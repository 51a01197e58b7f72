#ifndef HYBRIDSERVE_WORKER_DATA_PLANE_METRICS_H_
#define HYBRIDSERVE_WORKER_DATA_PLANE_METRICS_H_

// The data plane's byte counters, which both worker binaries expose
// (docs/ARCHITECTURE.md section 6):
//
//   hybridserve_data_plane_bytes_total{plane="cuda_ipc",
//                                      path="device_copy"|"socket",
//                                      direction="sent"|"received"}
//
// Message bytes the CUDA IPC plane's channels moved (transport::IpcTraffic):
// by a device copy into the receiver's device memory, or over the channel's
// control connection. Prefill counts what it sent, decode what it received;
// in place, a transfer's pages go by device copy (num_pages * page_bytes) and
// only the state and the frames by socket. Zero without a CUDA IPC plane.
//
// Thread-safe: Sync serializes on its own mutex (prometheus-cpp metrics are
// thread-safe).

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "transport/ipc_communicator.h"

namespace hybridserve::worker {

class DataPlaneMetrics {
 public:
  explicit DataPlaneMetrics(prometheus::Registry& registry);

  // Advances the counters to `now`, the planes' cumulative traffic (call it
  // before each scrape).
  void Sync(const transport::IpcTraffic& now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Counter& ipc_sent_device_copy_;
  prometheus::Counter& ipc_sent_socket_;
  prometheus::Counter& ipc_received_device_copy_;
  prometheus::Counter& ipc_received_socket_;
  absl::Mutex mu_;
  transport::IpcTraffic last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_DATA_PLANE_METRICS_H_
