#ifndef HYBRIDSERVE_PREFILL_SERVICE_H_
#define HYBRIDSERVE_PREFILL_SERVICE_H_

// The prefill service's gRPC edge: converts a PrefillRequest, queues it
// (bounded) for the one engine, runs the PrefillWorker, converts the outcome.
// Statuses: INVALID_ARGUMENT for a bad request or ticket; RESOURCE_EXHAUSTED
// when `max_queue` requests already wait; UNAVAILABLE while draining; the
// worker's and the data plane's errors otherwise.
//
// A call whose client cancels (decode cancels the calls of requests that
// ended: client cancel, Abort, deadline) leaves the queue at once, or stops
// within one prefill segment when it is running, so cancelled work never
// holds the queue.
//
// Thread-safe: gRPC calls Prefill from many threads; the engine is entered by
// one at a time.

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "prefill/metrics.h"
#include "prefill/prefill_worker.h"
#include "proto/prefill.grpc.pb.h"

namespace hybridserve::prefill {

class PrefillService final : public v1::Prefill::Service {
 public:
  // `worker` and `metrics` (null: none) must outlive the service. At most
  // `max_queue` requests wait while one runs.
  PrefillService(PrefillWorker& worker, int64_t max_queue, PrefillMetrics* metrics = nullptr)
      : worker_(worker), max_queue_(max_queue), metrics_(metrics) {}

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;

  // Refuses new requests with UNAVAILABLE.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // Requests admitted and not finished (queued or running).
  int64_t outstanding() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Waits, first come first served, until the engine is free for `ticket`;
  // false (and out of the queue) when the caller cancels first.
  bool AwaitEngine(uint64_t ticket, grpc::ServerContext* context) ABSL_LOCKS_EXCLUDED(mu_);

  PrefillWorker& worker_;
  const int64_t max_queue_;
  PrefillMetrics* const metrics_;
  mutable absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // The engine is entered by one call at a time (it is not thread-safe), in
  // arrival order: queue_ holds the tickets of the calls waiting for it.
  bool engine_busy_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_SERVICE_H_
