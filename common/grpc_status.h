#ifndef HYBRIDSERVE_COMMON_GRPC_STATUS_H_
#define HYBRIDSERVE_COMMON_GRPC_STATUS_H_

// The one conversion between absl::Status and grpc::Status, used by every gRPC
// edge (service handlers on the way out, clients on the way in). Both enums
// carry the same 17 canonical codes; each maps to its namesake, and the message
// is kept byte for byte. Payloads (absl) and error details (gRPC) are not
// carried. Stateless free functions: thread-safe.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace hybridserve::common {

// absl::StatusCode -> grpc::StatusCode, one to one over the 17 canonical
// codes; a code outside them (only constructible by casting) maps to UNKNOWN.
grpc::StatusCode ToGrpcStatusCode(absl::StatusCode code);

// grpc::StatusCode -> absl::StatusCode, the inverse of ToGrpcStatusCode; a
// code outside the 17 canonical ones (e.g. DO_NOT_USE) maps to kUnknown.
absl::StatusCode FromGrpcStatusCode(grpc::StatusCode code);

// OK maps to grpc::Status::OK; any other status keeps its code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// OK maps to absl::OkStatus() (absl drops the message of an OK status); any
// other status keeps its code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_GRPC_STATUS_H_
