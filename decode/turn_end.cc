#include "decode/turn_end.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_plan.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hybridserve::decode {

TurnEnd::TurnEnd(const common::Hash128& model_fingerprint, const cachestore::ModelNamespace& ns,
                 std::unique_ptr<cachestore::CachePublisher> publisher)
    : fingerprint_(model_fingerprint), namespace_(ns), publisher_(std::move(publisher)) {}

void TurnEnd::End(engine::SequenceTable& table, engine::SequenceId seq, GenerateRequest request,
                  const std::vector<TokenId>& generated, bool prefill_publishes_prompt, GenerationSink& sink,
                  Completion c, absl::Time ended) {
  c.usage.has_session = true;
  if (publisher_ == nullptr) {
    (void)table.Release(seq);
    if (request.session_pin) c.usage.session.pin_refused = "this decode worker publishes no turn-end states (no cache)";
    sink.OnComplete(c);
    return;
  }
  // The bytes leave the engine now; the puts, and then the final message,
  // follow on the publisher's thread, so the batch does not wait for the
  // cache and the next turn still finds the state.
  c.publication.attempted = true;
  absl::StatusOr<cachestore::Publication> p = Copy(table, seq, request, generated, prefill_publishes_prompt);
  (void)table.Release(seq);
  if (!p.ok()) {
    cachestore::PublicationResult export_failed;
    export_failed.failure = "export";
    export_failed.failure_message = std::string(p.status().message());
    Complete(request, sink, std::move(c), ended, export_failed);
    return;
  }
  p->done = [this, request = std::move(request), sink = &sink, c = std::move(c),
             ended](cachestore::PublicationResult result) mutable {
    Complete(request, *sink, std::move(c), ended, result);
  };
  publisher_->Publish(*std::move(p));
}

absl::StatusOr<cachestore::Publication> TurnEnd::Copy(const engine::SequenceTable& table, engine::SequenceId seq,
                                                      const GenerateRequest& request,
                                                      const std::vector<TokenId>& generated,
                                                      bool prefill_publishes_prompt) const {
  // The tokens fed to the model: the prompt and every generated token but the
  // last (sampled, not yet processed).
  std::vector<TokenId> fed = request.prompt;
  if (!generated.empty()) fed.insert(fed.end(), generated.begin(), generated.end() - 1);
  const int64_t position = static_cast<int64_t>(fed.size());
  cachestore::Publication p;
  // Placed by the fed tokens' chain, the one the next turn looks up: when the
  // prompt is shorter than a page, the reply may complete the first page
  // (docs/ARCHITECTURE.md, "Placement over shards").
  p.ns = namespace_.For(request.tenant, request.cache_salt, fed);
  const cachestore::CachePlan plan(p.ns, fed);
  const int64_t ps = plan.page_size();
  // Every full page is put, a model without attention layers included: its
  // pages hold no bytes but chain the prefix the state hangs from.
  const int64_t full = position / ps;
  // Prefill puts the prompt's full pages (after its answer, so perhaps not
  // yet): the pages past them are ours, and the first one's parent is
  // prefill's. Putting copies of prefill's pages too would race its puts of
  // the same entries (ABORTED on both sides) and move every prompt byte
  // twice. When prefill does not publish (it found the cache unreachable, or
  // has none), every page is copied here and the publisher puts those the
  // cache lacks (a probe): the loop thread never waits on the cache (a slow
  // one would stall the whole batch), only on the copy.
  if (prefill_publishes_prompt) {
    p.first_page = static_cast<int64_t>(request.prompt.size()) / ps;
    p.parent_from_other_writer = true;
  } else {
    p.probe_first = true;
  }
  for (int64_t i = p.first_page; i < full; ++i) {
    ASSIGN_OR_RETURN(std::string page, table.ExportPage(seq, i));
    p.pages.emplace_back(plan.PagePut(i), std::move(page));
  }
  std::string state;
  RETURN_IF_ERROR(table.EncodeStateInto(seq, /*with_logits=*/true, fingerprint_, plan.StateKeyAt(position), &state));
  cachestore::ClientPut state_put = plan.StatePut(position, cachestore::StateKind::kExactPrefix);
  state_put.ttl = request.session_keep;
  state_put.pin = request.session_pin;
  p.states.emplace_back(std::move(state_put), std::move(state));
  return p;
}

void TurnEnd::Complete(const GenerateRequest& request, GenerationSink& sink, Completion c, absl::Time ended,
                       const cachestore::PublicationResult& result) {
  PublicationReport& report = c.publication;
  SessionOutcome& outcome = c.usage.session;
  report.wait = absl::Now() - ended;
  report.pages = result.pages_put;
  report.failure = result.failure;
  report.parent_wait_expired = result.parent_wait_expired;
  if (!result.states.empty() && result.states[0].has_value()) {
    const cachestore::PutResult& put = *result.states[0];
    outcome.published = true;
    outcome.keep = put.ttl;
    outcome.pinned = put.pinned;
    outcome.pin_refused = put.pin_refused;
  } else if (request.session_pin) {
    outcome.pin_refused = absl::StrCat("the turn-end state was not published: ", result.failure_message);
  }
  if (!report.failure.empty()) {
    int64_t held_back = 0;
    if (log_limiter_.Allow(absl::StrCat("publication ", report.failure), &held_back)) {
      LOG(WARNING) << "turn-end publication of request " << request.request_id << " failed (" << report.failure
                   << (report.parent_wait_expired ? ", after waiting for prefill's parent page" : "")
                   << "): the next turn resumes from an earlier state" << common::HeldBack(held_back);
    }
  }
  sink.OnComplete(c);
}

}  // namespace hybridserve::decode
