#ifndef HYBRIDSERVE_WORKER_BOOTSTRAP_H_
#define HYBRIDSERVE_WORKER_BOOTSTRAP_H_

// What the prefill and decode binaries both start and stop, so that each
// main.cc is its flags and its wiring: the model and its engine, the
// cache stack (worker/cache_stack.h), the data planes, the metrics endpoint, the gRPC server,
// and the drain on SIGTERM. Errors name the flag they come from.
//
// Not thread-safe (start-up and shutdown run on main's thread), except where
// a comment says otherwise.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/connection_age.h"
#include "common/health_server.h"
#include "common/metrics.h"
#include "common/tls_flags.h"
#include "engine/backend_registry.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "grpcpp/grpcpp.h"
#include "transport/communicator.h"
#include "transport/ipc_communicator.h"
#include "transport/routing_sender.h"
#include "transport/transfer.h"
#include "worker/cache_stack.h"

namespace hybridserve::worker {

// The options both workers take (worker/flags.h reads them).
struct WorkerOptions {
  std::string model_dir;
  engine::Device device = engine::Device::kCpu;
  int32_t device_index = 0;  // the CUDA device of the engine and of NCCL channels
  int32_t threads = 2;       // kernel threads (CPU backend)
  int64_t page_size = 0;     // 0: min(16, chunk_size)
  int64_t max_pages = 4096;
  // The cache stack (worker/cache_stack.h); its TLS is tls.channel.
  CacheStackOptions cache;
  absl::Duration cache_failure_backoff = absl::Seconds(1);
  std::string metrics_address;  // empty: none
  absl::Duration shutdown_grace = absl::Seconds(10);
  // The gRPC server's maximum connection age and its grace
  // (common/connection_age.h; zero: unlimited).
  common::ConnectionAge connection_age;
  // TLS of the gRPC server, of the calls to the cachestore and prefill, and
  // the plaintext health port (common/tls_flags.h).
  common::TlsFlags tls;
};

// The model's weights (config.json + safetensors in model_dir).
absl::StatusOr<std::unique_ptr<engine::ModelWeights>> LoadModel(const WorkerOptions& options);
// An engine over `weights` with room for `max_sequences` sequences.
absl::StatusOr<std::unique_ptr<engine::Model>> NewEngine(const engine::ModelWeights& weights,
                                                         const WorkerOptions& options, int64_t max_sequences);

// The Prometheus endpoint; null without --metrics_address. `before_scrape`
// (may be empty) runs on the exposer's thread before each scrape.
absl::StatusOr<std::unique_ptr<common::MetricsExposer>> StartMetrics(const WorkerOptions& options,
                                                                     std::shared_ptr<prometheus::Registry> registry,
                                                                     std::function<void()> before_scrape = {});

// ---- Data planes (--data_planes) ----

// The planes a --data_planes value names (comma-separated: tcp, nccl,
// cuda_ipc), at least one; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<std::vector<transport::TransportKind>> ParseDataPlanes(absl::string_view flag);

// Prefill's side: a sender for each plane, routed by each ticket's kind.
class SenderPlanes {
 public:
  // `model` (for the CUDA IPC plane: the engine's device memory) must
  // outlive the planes.
  static absl::StatusOr<std::unique_ptr<SenderPlanes>> Open(const std::vector<transport::TransportKind>& planes,
                                                            engine::Model& model, const WorkerOptions& options);
  ~SenderPlanes();
  transport::StateSender& sender() { return *routing_; }
  // What the CUDA IPC plane's channels moved so far (zero without one). Thread-safe.
  transport::IpcTraffic ipc_traffic() const;

 private:
  SenderPlanes();
  std::vector<std::unique_ptr<transport::CommunicatorFactory>> factories_;
  std::vector<std::unique_ptr<transport::StateSender>> senders_;
  std::unique_ptr<transport::RoutingStateSender> routing_;
};

struct ReceiverPlaneOptions {
  transport::TransportKind kind = transport::TransportKind::kTcp;
  // TCP: where to listen, and the host prefill workers are told to connect
  // to (empty: the listening host; 127.0.0.1 for a wildcard).
  std::string data_address = "127.0.0.1:0";
  std::string advertise_host;
  // NCCL and CUDA IPC: the one prefill worker ("host:port") at the other end
  // of the channel.
  std::string peer;
};

// Decode's side: the receiver of its one plane, and the endpoint put on its
// tickets.
class ReceiverPlane {
 public:
  static absl::StatusOr<std::unique_ptr<ReceiverPlane>> Open(const ReceiverPlaneOptions& plane, engine::Model& model,
                                                             const WorkerOptions& options);
  ~ReceiverPlane();
  transport::StateReceiver& receiver() { return *receiver_; }
  const std::string& endpoint() const { return endpoint_; }
  // What the CUDA IPC plane's channels moved so far (zero for another plane). Thread-safe.
  transport::IpcTraffic ipc_traffic() const;
  // TCP: the listening address ("ip:port"); empty otherwise.
  const std::string& listening() const { return listening_; }

 private:
  ReceiverPlane() = default;
  std::unique_ptr<transport::CommunicatorFactory> factory_;
  std::unique_ptr<transport::StateReceiver> receiver_;
  std::string endpoint_;
  std::string listening_;
};

// ---- The gRPC server and the drain ----

// What a worker does when told to stop (SIGTERM, SIGINT), in this order:
//   1. health ("", readiness) turns NOT_SERVING; liveness stays SERVING
//      (common/health.h);
//   2. refuse(): new work is refused (UNAVAILABLE);
//   3. settle(grace_end): waits, at most until grace_end, for work in flight;
//   4. the server shuts down (what still runs at grace_end is cancelled);
//   5. before_wait(): ends what the server's handlers may wait for;
//   6. the server's handlers return.
// Any step may be empty.
struct DrainSteps {
  std::function<void()> refuse;
  std::function<void(absl::Time grace_end)> settle;
  std::function<void()> before_wait;
};

class GrpcServer {
 public:
  // Serves `services` (which must outlive the server) on `address`, with
  // health checking (common/health.h) and reflection, over TLS when
  // tls.server is (common/tls.h: client certificates, allowed peers on every
  // call), and the health service alone on tls.health_address when given;
  // each client connection told to go away at `connection_age`
  // (common/connection_age.h); `max_threads` > 0 bounds the server's threads.
  // UNAVAILABLE for a port in use (never shared: no SO_REUSEPORT);
  // INVALID_ARGUMENT for TLS files that cannot serve.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const std::string& address,
                                                           const std::vector<grpc::Service*>& services,
                                                           const common::TlsFlags& tls,
                                                           const common::ConnectionAge& connection_age,
                                                           int max_threads = 0);
  ~GrpcServer();
  int port() const { return port_; }
  int health_port() const { return health_ != nullptr ? health_->port() : 0; }
  // Readiness ("" on both health services) while the server is not
  // draining: a worker that cannot serve for now says so (decode with no
  // prefill worker resolved and no fallback prefill), and says so again when
  // it can. SERVING from Start on; the drain turns it NOT_SERVING for good,
  // whatever is set after. Thread-safe.
  void SetReady(bool ready) ABSL_LOCKS_EXCLUDED(ready_mu_);
  // Blocks until SIGTERM or SIGINT (common::InstallTerminationHandler), then
  // drains (DrainSteps) within `grace`.
  void ServeUntilSignal(absl::Duration grace, const DrainSteps& steps);

 private:
  GrpcServer() = default;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<common::HealthServer> health_;  // null without a health address
  int port_ = 0;
  absl::Mutex ready_mu_;  // orders SetReady against the drain
  bool draining_ ABSL_GUARDED_BY(ready_mu_) = false;
};

}  // namespace hybridserve::worker

#endif  // HYBRIDSERVE_WORKER_BOOTSTRAP_H_
