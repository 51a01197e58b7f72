#include "prefill/prefill_worker.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_plan.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/model_flops.h"
#include "engine/snapshot_codec.h"
#include "engine/state_snapshot.h"
#include "transport/engine_import.h"

namespace hybridserve::prefill {

// A live sequence at the resume point, and how it got there.
struct PrefillWorker::Resumed {
  engine::SequenceId seq = 0;
  int64_t position = 0;
  ResumeKind kind = ResumeKind::kCold;
  int64_t kv_match_tokens = 0;
  bool cache_reachable = true;  // false: the lookup failed
};

namespace {

// The keys of the lookup's first `n` pages.
std::vector<common::Hash128> PageKeys(const cachestore::LookupResult& lookup, size_t n) {
  std::vector<common::Hash128> keys;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) keys.push_back(lookup.pages[i].key);
  return keys;
}

// Releases a sequence when it goes out of scope, unless released already.
class SequenceGuard {
 public:
  SequenceGuard(engine::Model& model, engine::SequenceId id) : model_(model), id_(id) {}
  ~SequenceGuard() {
    if (id_ != 0) (void)model_.sequences().Release(id_);
  }
  SequenceGuard(const SequenceGuard&) = delete;
  SequenceGuard& operator=(const SequenceGuard&) = delete;
  // The caller keeps the sequence.
  void Dismiss() { id_ = 0; }

 private:
  engine::Model& model_;
  engine::SequenceId id_;
};

}  // namespace

PrefillWorker::PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint,
                             cachestore::CacheClient* cache, transport::StateSender& sender,
                             const PrefillWorkerOptions& options)
    : PrefillWorker(model, model_fingerprint, cache, &sender, options) {}

PrefillWorker::PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint,
                             cachestore::CacheClient* cache, const PrefillWorkerOptions& options)
    : PrefillWorker(model, model_fingerprint, cache, nullptr, options) {}

PrefillWorker::PrefillWorker(engine::Model& model, const common::Hash128& model_fingerprint,
                             cachestore::CacheClient* cache, transport::StateSender* sender,
                             const PrefillWorkerOptions& options)
    : model_(model),
      fingerprint_(model_fingerprint),
      namespace_{model_fingerprint.ToHex(), options.adapter, static_cast<int32_t>(model.page_size()),
                 engine::ModelPrefillCost(model.config())},
      cache_(cache),
      sender_(sender),
      options_(options) {
  if (cache_ == nullptr) return;
  cachestore::PublisherOptions po;
  po.max_queued = options_.max_pending_publications;
  po.cache_failure_backoff = options_.cache_failure_backoff;
  po.backoff = options_.cache_backoff;
  absl::StatusOr<std::unique_ptr<cachestore::CachePublisher>> publisher =
      cachestore::CachePublisher::Create(*cache_, po);
  CHECK(publisher.ok()) << "prefill worker options: " << publisher.status();
  publisher_ = *std::move(publisher);
}

cachestore::ClientNamespace PrefillWorker::Namespace(const PrefillRequest& request) const {
  return namespace_.For(request.tenant, request.cache_salt, request.prompt);
}

absl::Status PrefillWorker::FetchResumeBytes(const cachestore::LookupResult& lookup, int64_t pages, std::string* state,
                                             absl::FunctionRef<absl::Status(int64_t begin, int64_t end)> fetch_pages) {
  const int64_t streams = std::min<int64_t>(pages, std::max<int64_t>(1, options_.fetch_parallelism - 1));
  std::vector<absl::Status> results(static_cast<size_t>(streams));
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<size_t>(streams));
  for (int64_t i = 0; i < streams; ++i) {
    const int64_t begin = pages * i / streams, end = pages * (i + 1) / streams;
    helpers.emplace_back([&, i, begin, end] { results[static_cast<size_t>(i)] = fetch_pages(begin, end); });
  }
  absl::Status first_error = cache_->GetInto(lookup.lease_id, lookup.state->key, state);
  for (std::thread& t : helpers) t.join();
  for (const absl::Status& s : results) {
    if (first_error.ok() && !s.ok()) first_error = s;
  }
  return first_error;
}

absl::Status PrefillWorker::RestoreInPlace(engine::SequenceId seq, const cachestore::LookupResult& lookup,
                                           const engine::SnapshotExpectation& expect,
                                           const std::vector<std::vector<absl::Span<char>>>& regions) {
  absl::Status s;
  if (regions.size() != lookup.pages.size()) {
    s = absl::InvalidArgumentError(absl::StrCat("restore at position ", lookup.resume_position, " needs ",
                                                regions.size(), " full pages, the lookup holds ", lookup.pages.size()));
  }
  std::string state;
  if (s.ok()) {
    const std::vector<common::Hash128> keys = PageKeys(lookup, regions.size());
    std::vector<cachestore::EntrySegments> destinations(regions.size());
    for (size_t i = 0; i < regions.size(); ++i) destinations[i].segments = regions[i];
    s = FetchResumeBytes(lookup, static_cast<int64_t>(keys.size()), &state, [&](int64_t begin, int64_t end) {
      return cache_->GetManyScattered(lookup.lease_id, absl::MakeConstSpan(keys).subspan(begin, end - begin),
                                      absl::MakeConstSpan(destinations).subspan(begin, end - begin));
    });
    publisher_->backoff().Note(s);
  }
  if (s.ok()) {
    absl::StatusOr<engine::SnapshotView> view = engine::ParseSnapshot(state, expect);
    s = view.ok() ? model_.sequences().FinishRestoreInPlace(seq, *view) : view.status();
  }
  if (!s.ok()) {
    // The pages go back. Its one refusal, "not restoring", means
    // FinishRestoreInPlace failed writing the state and gave them back itself.
    model_.sequences().AbortRestoreInPlace(seq).IgnoreError();
  }
  return s;
}

absl::Status PrefillWorker::RestoreThroughBuffers(engine::SequenceId seq, const cachestore::LookupResult& lookup,
                                                  const engine::SnapshotExpectation& expect) {
  // A model without attention layers has empty pages: nothing to fetch
  // (Restore takes none).
  const size_t page_count = model_.page_bytes() > 0 ? lookup.pages.size() : 0;
  std::vector<std::string> pages(page_count);
  const std::vector<common::Hash128> keys = PageKeys(lookup, page_count);
  std::string state;
  absl::Status s = FetchResumeBytes(lookup, static_cast<int64_t>(page_count), &state, [&](int64_t begin, int64_t end) {
    return cache_->GetManyInto(lookup.lease_id, absl::MakeConstSpan(keys).subspan(begin, end - begin),
                               absl::MakeSpan(pages).subspan(begin, end - begin));
  });
  publisher_->backoff().Note(s);
  RETURN_IF_ERROR(s);
  ASSIGN_OR_RETURN(const engine::SnapshotView view, engine::ParseSnapshot(state, expect));
  std::vector<absl::string_view> page_views(pages.begin(), pages.end());
  return model_.sequences().Restore(seq, view, page_views);
}

bool PrefillWorker::RestoreFromCache(engine::SequenceId seq, const cachestore::LookupResult& lookup,
                                     int64_t prompt_tokens, const common::Hash128& prefix_hash) {
  const int64_t p = lookup.resume_position;
  engine::SnapshotExpectation expect;
  expect.model_fingerprint = fingerprint_;
  expect.layout = model_.layout();
  expect.position = p;
  expect.prefix_hash = prefix_hash;
  absl::Status s;
  // Pages straight into the pool where the host can write it; a model
  // without pages has nothing to place.
  absl::StatusOr<std::vector<std::vector<absl::Span<char>>>> regions =
      model_.page_bytes() > 0 && !lookup.pages.empty()
          ? model_.sequences().BeginRestoreInPlace(seq, p)
          : absl::StatusOr<std::vector<std::vector<absl::Span<char>>>>(absl::UnimplementedError("no pages"));
  if (regions.ok()) {
    s = RestoreInPlace(seq, lookup, expect, *regions);
  } else if (absl::IsUnimplemented(regions.status())) {
    s = RestoreThroughBuffers(seq, lookup, expect);
  } else {
    s = regions.status();
  }
  if (!s.ok()) {
    // A miss, never a failure: the restore changed nothing.
    Count(&PrefillCacheCounters::errors_as_misses);
    int64_t held_back = 0;
    if (log_limiter_.Allow(absl::StrCat("resume ", common::FailureReason(s)), &held_back)) {
      LOG(WARNING) << "cache resume at " << p << " of " << prompt_tokens << " tokens abandoned: " << s
                   << common::HeldBack(held_back);
    }
    return false;
  }
  return true;
}

absl::StatusOr<PrefillWorker::Resumed> PrefillWorker::Resume(const PrefillRequest& request,
                                                             const cachestore::ClientNamespace& ns) {
  Resumed r;
  ASSIGN_OR_RETURN(r.seq, model_.sequences().New());
  if (cache_ == nullptr) return r;
  const cachestore::CachePlan plan(ns, request.prompt);
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  // The whole prompt first; when only a state at n without logits is found,
  // the prompt less its last token, so that the last logits get computed.
  if (publisher_->backoff().Skipping()) {
    r.cache_reachable = false;  // a miss, without waiting for a cache that just failed to answer
    return r;
  }
  for (int64_t probe : {n, n - 1}) {
    if (probe < 1) break;
    Count(&PrefillCacheCounters::lookups);
    absl::StatusOr<cachestore::LookupResult> lookup = cache_->Lookup(
        ns, absl::MakeConstSpan(request.prompt).subspan(0, static_cast<size_t>(probe)), cachestore::LookupMode::kLease);
    if (!lookup.ok()) {
      publisher_->backoff().Note(lookup.status());
      Count(&PrefillCacheCounters::errors_as_misses);
      r.cache_reachable = false;
      int64_t held_back = 0;
      if (log_limiter_.Allow(absl::StrCat("lookup ", common::FailureReason(lookup.status())), &held_back)) {
        LOG(WARNING) << "cache lookup failed, prefilling cold: " << lookup.status() << common::HeldBack(held_back);
      }
      return r;
    }
    r.kv_match_tokens = std::max(r.kv_match_tokens, lookup->kv_match_tokens);
    if (lookup->resume_position == 0 || !lookup->state.has_value()) {
      if (lookup->lease_id != 0) (void)cache_->Release(lookup->lease_id);
      return r;
    }
    const bool restored = RestoreFromCache(r.seq, *lookup, n, plan.StateKeyAt(lookup->resume_position));
    (void)cache_->Release(lookup->lease_id);
    if (!restored) return r;
    ASSIGN_OR_RETURN(const engine::SequenceTable::Sequence* seq, model_.sequences().Find(r.seq));
    if (lookup->resume_position == n && seq->last_logits.empty()) {
      // Usable only with the last logits: start over one token short.
      RETURN_IF_ERROR(model_.sequences().Release(r.seq));
      ASSIGN_OR_RETURN(r.seq, model_.sequences().New());
      continue;
    }
    Count(&PrefillCacheCounters::hits);
    r.position = lookup->resume_position;
    r.kind = lookup->state->state_kind == cachestore::StateKind::kGridCheckpoint ? ResumeKind::kGridCheckpoint
                                                                                 : ResumeKind::kExactPrefix;
    return r;
  }
  return r;
}

// Steps 1-3: the sequence at the prompt's end, the first token, the grid
// checkpoints crossed, and the usage.
struct PrefillWorker::Computed {
  Resumed resumed;
  PrefillOutcome outcome;
  std::vector<engine::SequenceState> checkpoints;
};

absl::Status PrefillWorker::CheckPrompt(absl::Span<const TokenId> prompt) const {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= model_.config().vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids[", i, "] = ", prompt[i], " outside [0, ", model_.config().vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status PrefillWorker::CheckCancelled(const PrefillRequest& request) {
  if (request.cancellation == nullptr || !request.cancellation->cancelled()) return absl::OkStatus();
  Count(&PrefillCacheCounters::cancelled);
  return absl::CancelledError("the caller cancelled the prefill");
}

absl::StatusOr<PrefillWorker::Computed> PrefillWorker::Compute(const PrefillRequest& request,
                                                               const cachestore::ClientNamespace& ns,
                                                               engine::Sampler& sampler) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const absl::Time resume_start = absl::Now();
  Computed c;
  ASSIGN_OR_RETURN(c.resumed, Resume(request, ns));
  SequenceGuard guard(model_, c.resumed.seq);
  const absl::Time compute_start = absl::Now();

  std::vector<float> logits;
  if (c.resumed.position < n) {
    engine::PrefillOptions options;
    options.emit_checkpoints = cache_ != nullptr && options_.publish;
    if (request.cancellation != nullptr) {
      options.cancelled = [cancellation = request.cancellation.get()] { return cancellation->cancelled(); };
    }
    absl::StatusOr<engine::PrefillResult> result =
        model_.Prefill(c.resumed.seq, absl::MakeConstSpan(request.prompt).subspan(c.resumed.position), options);
    if (!result.ok()) {
      if (result.status().code() == absl::StatusCode::kCancelled) Count(&PrefillCacheCounters::cancelled);
      return result.status();
    }
    logits = std::move(result->logits);
    c.checkpoints = std::move(result->checkpoints);
  } else {
    ASSIGN_OR_RETURN(const engine::SequenceTable::Sequence* seq, model_.sequences().Find(c.resumed.seq));
    logits = seq->last_logits;
  }
  PrefillOutcome& outcome = c.outcome;
  ASSIGN_OR_RETURN(outcome.first, sampler.Sample(logits, /*step=*/0));
  outcome.resume_time = compute_start - resume_start;
  outcome.compute_time = absl::Now() - compute_start;
  outcome.usage.prompt_tokens = n;
  outcome.usage.cached_tokens = c.resumed.position;
  outcome.usage.recomputed_tokens = std::max<int64_t>(0, std::min(c.resumed.kv_match_tokens, n) - c.resumed.position);
  outcome.usage.kv_match_tokens = c.resumed.kv_match_tokens;
  outcome.usage.resume_kind = c.resumed.kind;
  RETURN_IF_ERROR(CheckCancelled(request));
  guard.Dismiss();
  return c;
}

void PrefillWorker::PublishPrompt(const Computed& computed, const PrefillRequest& request,
                                  const cachestore::ClientNamespace& ns, PrefillOutcome* outcome) {
  // The bytes leave the engine here; the puts run inline, or on the
  // publisher thread with async_publication (then the answer does not wait
  // for them). A cache that failed this call's lookup gets nothing from it:
  // decode publishes the turn end from the first page the cache lacks instead.
  if (cache_ == nullptr || !options_.publish || !computed.resumed.cache_reachable) return;
  outcome->publishes_prompt = true;
  cachestore::Publication publication = Prepare(computed.resumed.seq, request, ns, computed.resumed.position,
                                                computed.resumed.kv_match_tokens, computed.checkpoints);
  if (options_.async_publication) {
    publisher_->Publish(std::move(publication));  // waits while max_pending_publications wait
  } else {
    publisher_->PublishNow(std::move(publication));
  }
}

absl::StatusOr<PrefillOutcome> PrefillWorker::Prefill(const PrefillRequest& request) {
  if (sender_ == nullptr) {
    return absl::FailedPreconditionError("this prefill worker has no data plane: it only prefills in place");
  }
  RETURN_IF_ERROR(CheckPrompt(request.prompt));
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (request.ticket.n_tokens != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the transfer ticket is for ", request.ticket.n_tokens, " tokens, the prompt has ", n));
  }
  RETURN_IF_ERROR(transport::CheckTicket(model_.sequences(), request.ticket));
  ASSIGN_OR_RETURN(engine::Sampler sampler, engine::Sampler::Create(request.sampling));

  RETURN_IF_ERROR(CheckCancelled(request));
  const cachestore::ClientNamespace ns = Namespace(request);
  ASSIGN_OR_RETURN(Computed computed, Compute(request, ns, sampler));
  SequenceGuard guard(model_, computed.resumed.seq);
  PrefillOutcome& outcome = computed.outcome;

  const cachestore::CachePlan plan(ns, request.prompt);
  // Decode keeps of the pages it holds (read from the cache) only those this
  // worker restored from the cache too: the same entries, so the same bytes.
  // Past them it sends its own, which may differ in the last bits from a
  // cached page another path computed (a decode step's, not a prefill's).
  transport::Ticket ticket = request.ticket;
  ticket.held_pages = std::min(ticket.held_pages, computed.resumed.position / model_.page_size());
  ASSIGN_OR_RETURN(
      const transport::SequenceStateSource source,
      transport::SequenceStateSource::Create(model_.sequences(), computed.resumed.seq, ticket, fingerprint_,
                                             plan.StateKeyAt(n), outcome.first.token, outcome.first.logprob));
  const absl::Time start = absl::Now();
  Count(&PrefillCacheCounters::transfers_in_flight);
  const absl::Status sent = sender_->Send(ticket, source);
  Count(&PrefillCacheCounters::transfers_in_flight, -1);
  if (!sent.ok()) {
    Count(&PrefillCacheCounters::transfer_failures);
    return sent;
  }
  outcome.transfer_time = absl::Now() - start;
  // What crossed the data plane: the pages decode does not hold, and the state.
  outcome.transfer_bytes =
      (source.num_pages() - ticket.held_pages) * source.page_bytes() + static_cast<int64_t>(source.state().size());
  // After the push: publication never delays decode.
  PublishPrompt(computed, request, ns, &outcome);
  return outcome;
}

absl::StatusOr<KeptPrefill> PrefillWorker::PrefillAndKeep(const PrefillRequest& request, int64_t reserve_positions) {
  RETURN_IF_ERROR(CheckPrompt(request.prompt));
  if (reserve_positions < static_cast<int64_t>(request.prompt.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserving ", reserve_positions, " positions for a prompt of ", request.prompt.size(), " tokens"));
  }
  ASSIGN_OR_RETURN(engine::Sampler sampler, engine::Sampler::Create(request.sampling));
  RETURN_IF_ERROR(CheckCancelled(request));
  const cachestore::ClientNamespace ns = Namespace(request);
  ASSIGN_OR_RETURN(Computed computed, Compute(request, ns, sampler));
  SequenceGuard guard(model_, computed.resumed.seq);
  RETURN_IF_ERROR(model_.sequences().ReservePages(computed.resumed.seq, reserve_positions));
  PublishPrompt(computed, request, ns, &computed.outcome);
  guard.Dismiss();
  return KeptPrefill{computed.resumed.seq, std::move(computed.outcome)};
}

void PrefillWorker::Count(int64_t PrefillCacheCounters::*field, int64_t n) {
  absl::MutexLock lock(&counters_mu_);
  counters_.*field += n;
}

PrefillCacheCounters PrefillWorker::counters() const {
  PrefillCacheCounters out;
  {
    absl::MutexLock lock(&counters_mu_);
    out = counters_;
  }
  if (publisher_ != nullptr) {
    const cachestore::PublisherCounters p = publisher_->counters();
    out.pages_published = p.pages_published;
    out.states_published = p.states_published;
    out.publish_failures = p.failures;
    out.publish_failures_by_reason = p.failures_by_reason;
    out.publications_in_flight = publisher_->in_flight();
  }
  return out;
}

bool PrefillWorker::WaitForPublications(absl::Duration timeout) {
  return publisher_ == nullptr || publisher_->WaitIdle(timeout);
}

cachestore::Publication PrefillWorker::Prepare(engine::SequenceId seq, const PrefillRequest& request,
                                               const cachestore::ClientNamespace& ns, int64_t resumed_at,
                                               int64_t kv_match_tokens,
                                               const std::vector<engine::SequenceState>& checkpoints) {
  cachestore::Publication out;
  out.ns = ns;
  const cachestore::CachePlan plan(ns, request.prompt);
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t ps = plan.page_size();
  // Pages the cache does not hold yet, in order (each needs its parent). A
  // model without attention layers has pages too: empty, they chain the
  // prefix its states hang from.
  const int64_t full = n / ps;
  out.first_page = std::min(kv_match_tokens, resumed_at) / ps;
  for (int64_t i = out.first_page; i < full; ++i) {
    absl::StatusOr<std::string> page = model_.sequences().ExportPage(seq, i);
    if (!page.ok()) break;
    out.pages.emplace_back(plan.PagePut(i), *std::move(page));
  }
  const int64_t grid = model_.options().checkpoint_interval;
  const int64_t every = options_.checkpoint_publish_interval == 0 ? grid : options_.checkpoint_publish_interval;
  const int64_t branch = kv_match_tokens > resumed_at ? kv_match_tokens / grid * grid : 0;
  for (const engine::SequenceState& checkpoint : checkpoints) {
    const int64_t q = checkpoint.position;
    if (!(every > 0 && q % every == 0) && q != branch) continue;
    // A prompt ending on the grid: the end snapshot below has this key and
    // the logits too. Putting both would move the state twice, and whichever
    // landed first would be kept (a grid checkpoint loses the logits, so the
    // same prompt again would resume at an earlier checkpoint).
    if (q == n) continue;
    absl::StatusOr<engine::Snapshot> snapshot =
        engine::ToSnapshot(checkpoint, model_.layout(), fingerprint_, plan.StateKeyAt(q));
    absl::StatusOr<std::string> bytes =
        snapshot.ok() ? engine::EncodeSnapshot(*snapshot) : absl::StatusOr<std::string>(snapshot.status());
    if (bytes.ok())
      out.states.emplace_back(plan.StatePut(q, cachestore::StateKind::kGridCheckpoint), *std::move(bytes));
  }
  std::string end_state;
  if (model_.sequences()
          .EncodeStateInto(seq, /*with_logits=*/true, fingerprint_, plan.StateKeyAt(n), &end_state)
          .ok()) {
    out.states.emplace_back(plan.StatePut(n, cachestore::StateKind::kExactPrefix), std::move(end_state));
  }
  return out;
}

}  // namespace hybridserve::prefill
