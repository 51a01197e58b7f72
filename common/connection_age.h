#ifndef HYBRIDSERVE_COMMON_CONNECTION_AGE_H_
#define HYBRIDSERVE_COMMON_CONNECTION_AGE_H_

// How long a gRPC server keeps one client connection: every server of ours
// (decode's Generation edge, prefill, the cachestore) is built with
// ApplyConnectionAge, so the setting lives here and nowhere else.
//
// Why. A Kubernetes ClusterIP balances connections, not calls: a client's one
// HTTP/2 connection stays on the pod it first reached, so pods added later
// (a scale-out, a rollout) get nothing from clients that are already
// connected. With a maximum age the server sends a GOAWAY when a connection
// reaches it (gRPC adds its own jitter of +-10%, so a fleet's connections do
// not all reconnect at once): the client opens a new connection, which the
// ClusterIP may send to any pod, for its new calls, while the calls already
// on the old connection go on for up to `grace`; whatever still runs then is
// cut (the client sees UNAVAILABLE).

#include "absl/time/time.h"
#include "grpcpp/server_builder.h"

namespace hybridserve::common {

struct ConnectionAge {
  // The age at which a connection is told to go away; zero: never.
  absl::Duration max_age = absl::ZeroDuration();
  // How long the calls on a connection told to go away may still run; zero:
  // as long as they take (the connection closes with its last call).
  absl::Duration grace = absl::ZeroDuration();
};

// Sets `age` on `builder` (GRPC_ARG_MAX_CONNECTION_AGE_MS and
// GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS), in whole milliseconds (at least 1,
// at most INT_MAX, about 24.8 days). Sets nothing for a zero max_age. Negative
// durations are refused where flags become options (a CHECK here).
void ApplyConnectionAge(const ConnectionAge& age, grpc::ServerBuilder& builder);

}  // namespace hybridserve::common

#endif  // HYBRIDSERVE_COMMON_CONNECTION_AGE_H_
