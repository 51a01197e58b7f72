#ifndef HYBRIDSERVE_COMMON_HEALTH_SERVER_H_
#define HYBRIDSERVE_COMMON_HEALTH_SERVER_H_

// The plaintext health port (--health_address): a gRPC server with only the
// standard health service, for probes that cannot present a client
// certificate (kubelet's gRPC probes) when the main port requires one. It
// answers the same names as the main port (common/health.h); its owner sets
// both. Nothing but health status is served on it.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace hybridserve::common {

class HealthServer {
 public:
  // Listens on `address` (port 0 picks one), SERVING for "" and liveness;
  // UNAVAILABLE naming --health_address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address);
  ~HealthServer();  // shuts down at once

  int port() const { return port_; }
  void SetServing(const std::string& service, bool serving);

 private:
  HealthServer() = default;
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_HEALTH_SERVER_H_
