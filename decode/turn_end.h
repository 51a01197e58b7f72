#ifndef HYBRIDSERVE_DECODE_TURN_END_H_
#define HYBRIDSERVE_DECODE_TURN_END_H_

// A request's turn end (docs/ARCHITECTURE.md section 3, step 4): on a normal
// end the state after the last token fed to the model (with the logits that
// chose the last token) and the pages of the generated tokens go to the
// cache before the final message, so the client's next turn, whose prompt
// extends this one, finds them. The loop thread only copies those bytes out
// of the engine; a cachestore::CachePublisher puts them on its thread and
// then the final message is sent with what became of them.
//
// Thread-safe: End and Copy on the engine's thread, in_flight on any.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachestore/client/cache_publisher.h"
#include "cachestore/model_namespace.h"
#include "common/hash.h"
#include "common/log_rate_limiter.h"
#include "common/tokens.h"
#include "decode/generation.h"
#include "engine/sequence_table.h"

namespace hybridserve::decode {

class TurnEnd {
 public:
  // `publisher` null: nothing is published (no cache, or publication off).
  TurnEnd(const common::Hash128& model_fingerprint, const cachestore::ModelNamespace& ns,
          std::unique_ptr<cachestore::CachePublisher> publisher);
  // Runs the turn ends already queued (their final messages are sent).
  ~TurnEnd() = default;

  // On the engine's thread, for a request that ended normally (stop or
  // length): copies its turn end out of sequence `seq` of `table`, releases
  // `seq`, and hands the copy to the publisher; `c` goes to `sink` once the
  // puts are done (on the publisher's thread), with what became of them.
  // Without a publisher, `c` goes at once. Blocks while the publisher's
  // queue is full (backpressure).
  void End(engine::SequenceTable& table, engine::SequenceId seq, GenerateRequest request,
           const std::vector<TokenId>& generated, bool prefill_publishes_prompt, GenerationSink& sink, Completion c,
           absl::Time ended);
  // Turn ends handed to the publisher and not yet completed.
  int64_t in_flight() const { return publisher_ == nullptr ? 0 : publisher_->in_flight(); }

  // The publication of `request`'s turn end, copied out of sequence `seq` of
  // `table`: the full pages past the prompt when prefill publishes the
  // prompt's (their first parent is prefill's, waited for), else every full
  // page, probed first (the publisher puts those the cache lacks); then the
  // state at the last fed position, with the request's keep and pin.
  absl::StatusOr<cachestore::Publication> Copy(const engine::SequenceTable& table, engine::SequenceId seq,
                                               const GenerateRequest& request, const std::vector<TokenId>& generated,
                                               bool prefill_publishes_prompt) const;

 private:
  // Sends `c` to `sink` with what became of the publication `result`
  // reported in it; a failure is logged, rate-limited.
  void Complete(const GenerateRequest& request, GenerationSink& sink, Completion c, absl::Time ended,
                const cachestore::PublicationResult& result);

  const common::Hash128 fingerprint_;
  const cachestore::ModelNamespace namespace_;
  common::LogRateLimiter log_limiter_;
  // Last: destroyed first, running what is queued while the rest still lives.
  const std::unique_ptr<cachestore::CachePublisher> publisher_;
};

}  // namespace hybridserve::decode

#endif  // HYBRIDSERVE_DECODE_TURN_END_H_
