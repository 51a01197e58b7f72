#ifndef HYBRIDSERVE_PREFILL_IN_PROCESS_PREFILL_CLIENT_H_
#define HYBRIDSERVE_PREFILL_IN_PROCESS_PREFILL_CLIENT_H_

// Aggregated mode: a PrefillClient that runs a PrefillWorker in this process
// (its own engine, its sender an in-process data plane into the decode
// engine's reservation). The same worker code, the same ticket checks and the
// same cache traffic as the disaggregated path, without gRPC or sockets, so
// its tokens and logprobs are the disaggregated path's bit for bit.
//
// Thread-safe: calls enter the worker one at a time.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prefill/prefill_client.h"
#include "prefill/prefill_worker.h"

namespace hybridserve::prefill {

class InProcessPrefillClient final : public PrefillClient {
 public:
  // `worker` must outlive the client.
  explicit InProcessPrefillClient(PrefillWorker& worker) : worker_(worker) {}

  // The worker's outcome; CANCELLED or DEADLINE_EXCEEDED (the ticket's) when
  // the request's turn comes too late.
  absl::StatusOr<PrefillOutcome> Prefill(const PrefillRequest& request) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  PrefillWorker& worker_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hybridserve::prefill

#endif  // HYBRIDSERVE_PREFILL_IN_PROCESS_PREFILL_CLIENT_H_
