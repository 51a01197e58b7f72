#ifndef HYBRIDSERVE_PREFILL_GRPC_PREFILL_CLIENT_H_
#define HYBRIDSERVE_PREFILL_GRPC_PREFILL_CLIENT_H_

// A PrefillClient over a pool of prefill workers, by gRPC (proto/prefill.proto).
//
// The pool is a list of targets, "host:port" each. A host that is a name is
// resolved to all of its addresses, and re-resolved every
// `resolve_interval` (a Kubernetes headless service lists one address per
// worker); when a resolution fails, the previous addresses are kept.
//
// Each call goes to the worker with the fewest outstanding calls (ties in
// turn). A worker whose call fails with UNAVAILABLE, DEADLINE_EXCEEDED or
// RESOURCE_EXHAUSTED is skipped for `failure_backoff` (unless every worker is
// being skipped). A call refused before any work (UNAVAILABLE: unreachable or
// draining; RESOURCE_EXHAUSTED: queue full) is tried on another worker, up to
// `max_attempts` in all, within the call's deadline: a retry reuses the ticket,
// and the receiver refuses a transfer that an earlier attempt had begun, so
// a retry never lands two states. When every worker tried was full
// (RESOURCE_EXHAUSTED), the call waits (5 ms, doubling to 100 ms) and tries
// again, until its deadline or its cancellation: an admitted request never
// fails because prefill is busy. When every worker tried is unreachable
// (UNAVAILABLE), it does the same for at most `unavailable_wait` (not at all
// for a call with skip_unavailable_wait). Its cancellation cancels the gRPC call in
// flight (the prefill worker sees it within a segment).
//
// Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "prefill/prefill_client.h"
#include "proto/prefill.grpc.pb.h"

namespace hybridserve::prefill {

struct PrefillPoolOptions {
  std::vector<std::string> targets;  // "host:port"; at least one
  absl::Duration resolve_interval = absl::Seconds(10);
  absl::Duration failure_backoff = absl::Seconds(5);
  int max_attempts = 3;
  // When every worker tried is unreachable (UNAVAILABLE: restarting, its
  // channel reconnecting), the call keeps trying for this long before it
  // fails: a prefill worker that restarts costs its callers a wait, not an
  // error. The channels' reconnect backoff is capped at 1 s (100 ms at
  // first), so a worker back within the wait is reached within it.
  absl::Duration unavailable_wait = absl::Seconds(3);
  // TLS to the prefill workers (mutual TLS with decode's certificate); off
  // when tls.ca_file is empty. A worker's certificate must name the host of
  // the target its address was resolved from (unless tls.server_name is
  // set): the channel dials the address, but a Kubernetes headless Service's
  // pods hold certificates for the Service's name, never for their pod IPs.
  common::ChannelTlsOptions tls;
};

class GrpcPrefillClient final : public PrefillClient {
 public:
  // INVALID_ARGUMENT for no target, a target that is not host:port, a
  // non-positive interval or attempt count, or TLS options that cannot work
  // (common/tls.h). Names that do not resolve yet are
  // not an error (the pool fills as they resolve).
  static absl::StatusOr<std::unique_ptr<GrpcPrefillClient>> Create(const PrefillPoolOptions& options);
  ~GrpcPrefillClient() override;

  // UNAVAILABLE when no worker is known; otherwise the last attempt's status
  // (the prefill worker's own status, or the channel's).
  absl::StatusOr<PrefillOutcome> Prefill(const PrefillRequest& request) override ABSL_LOCKS_EXCLUDED(mu_);

  struct WorkerState {
    std::string address;  // "ip:port"
    int64_t outstanding = 0;
    bool skipped = false;  // in failure backoff
  };
  std::vector<WorkerState> workers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Worker;
  GrpcPrefillClient(const PrefillPoolOptions& options, std::shared_ptr<grpc::ChannelCredentials> credentials);
  void ResolveLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Resolve() ABSL_LOCKS_EXCLUDED(mu_);
  // The worker to call next, none of `tried`; null when none is left. With
  // `count`, the call is counted as outstanding on it.
  std::shared_ptr<Worker> Pick(const std::vector<std::shared_ptr<Worker>>& tried, bool count) ABSL_LOCKS_EXCLUDED(mu_);

  const PrefillPoolOptions options_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;  // of every worker's channel
  mutable absl::Mutex mu_;
  // Workers by address; a worker that leaves the resolution stays alive while
  // calls hold it.
  std::vector<std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t turn_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread resolver_;
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_GRPC_PREFILL_CLIENT_H_
