#ifndef HYBRIDSERVE_DECODE_IN_PROCESS_PREFILL_H_
#define HYBRIDSERVE_DECODE_IN_PROCESS_PREFILL_H_

// Aggregated mode: a PrefillClient that runs a PrefillWorker in this process
// (its own engine, its sender an in-process data plane into the decode
// engine's reservation). The same worker code, the same ticket checks and the
// same cache traffic as the disaggregated path, without gRPC or sockets, so
// its tokens and logprobs are the disaggregated path's bit for bit.
//
// Thread-safe: calls enter the worker one at a time.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "decode/decode_loop.h"
#include "prefill/prefill_worker.h"

namespace hybridserve::decode {

class InProcessPrefillClient final : public PrefillClient {
 public:
  // `worker` must outlive the client.
  explicit InProcessPrefillClient(prefill::PrefillWorker& worker) : worker_(worker) {}

  absl::StatusOr<PrefillReply> Prefill(const PrefillCall& call) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  prefill::PrefillWorker& worker_ ABSL_GUARDED_BY(mu_);
};

// The decode-side reply for a worker's outcome (shared with the gRPC client).
PrefillReply ReplyFromOutcome(prefill::PrefillOutcome outcome);

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_IN_PROCESS_PREFILL_H_
