#ifndef HYBRIDSERVE_COMMON_HEALTH_H_
#define HYBRIDSERVE_COMMON_HEALTH_H_

// The names every server answers on the standard gRPC health service
// (grpc.health.v1.Health), for Kubernetes' probes and load balancers:
//   - "" (the server as a whole): SERVING while it takes work, NOT_SERVING
//     from the start of its drain (SIGTERM) on: readiness;
//   - kLivenessHealthService: SERVING from the moment the server listens
//     until the process exits, its drain included: startup and liveness (a
//     draining worker is alive, and must not be killed before its grace).

namespace hybridserve::common {

inline constexpr char kLivenessHealthService[] = "hybridserve.liveness";

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_HEALTH_H_
