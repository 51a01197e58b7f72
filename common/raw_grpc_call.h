#ifndef HYBRIDSERVE_COMMON_RAW_GRPC_CALL_H_
#define HYBRIDSERVE_COMMON_RAW_GRPC_CALL_H_

// Tests' unary gRPC call by method name with raw request bytes (no generated
// stub: e.g. grpc.health.v1.Health/Check, or a service's method a test
// expects to be refused before its request is read). Testonly.

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace hybridserve::common {

struct RawCallResult {
  grpc::Status status;
  std::string response;    // the raw response (when status is OK)
  std::string server_pem;  // the server certificate the call saw (TLS), or ""
};

// Blocks until the call ends (within `deadline`).
RawCallResult RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                           const std::string& request = "", absl::Duration deadline = absl::Seconds(10));

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_RAW_GRPC_CALL_H_
