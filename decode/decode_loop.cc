#include "decode/decode_loop.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_publisher.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "decode/tenant.h"
#include "engine/model_flops.h"
#include "transport/engine_import.h"

namespace hybridserve::decode {

struct DecodeLoop::Request {
  enum class Phase { kWaiting, kPrefilling, kDecoding };

  GenerateRequest req;
  std::string key;  // ScopedRequestId(req.tenant, req.request_id): the loop's name for it
  GenerationSink* sink = nullptr;
  std::optional<engine::Sampler> sampler;
  Phase phase = Phase::kWaiting;
  engine::ImportReservation reservation;  // from admission on
  transport::Ticket ticket;
  std::shared_ptr<common::Cancellation> cancellation;  // of the prefill call
  bool reads_history = false;                          // its call writes the prompt's cached pages into the reservation
  prefill::PrefillOutcome prefill;
  std::vector<TokenId> generated;
  absl::Time ended;  // when Finish took it out of the batch
};

absl::StatusOr<std::unique_ptr<DecodeLoop>> DecodeLoop::Create(
    engine::Model& model, const common::Hash128& model_fingerprint, prefill::PrefillClient& prefill,
    transport::StateReceiver& receiver, cachestore::CacheClient* cache, const DecodeLoopOptions& options,
    KeepingPrefill local_prefill) {
  if (options.max_batch < 1 || options.max_waiting < 0 || options.transfer_timeout <= absl::ZeroDuration() ||
      options.publish_parent_wait < absl::ZeroDuration() || options.cache_failure_backoff < absl::ZeroDuration() ||
      options.history_read_streams < 1 || options.history_read_min_bytes < 0 || options.local_prefill_max_tokens < 0 ||
      options.fallback_prefill_max_tokens < 0) {
    return absl::InvalidArgumentError(
        "decode loop: max_batch >= 1, max_waiting >= 0, a positive transfer_timeout, a publish_parent_wait >= 0, "
        "a cache_failure_backoff >= 0, history_read_streams >= 1, history_read_min_bytes >= 0, "
        "local_prefill_max_tokens >= 0 and fallback_prefill_max_tokens >= 0");
  }
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(model, model_fingerprint, prefill, receiver, options));
  if (local_prefill && options.fallback_prefill_max_tokens > 0) loop->fallback_prefill_ = local_prefill;
  if (cache != nullptr) {
    loop->cache_backoff_ = options.cache_backoff != nullptr
                               ? options.cache_backoff
                               : std::make_shared<cachestore::CacheBackoff>(options.cache_failure_backoff);
    if (options.read_history_pages) {
      HistoryReaderOptions ho;
      ho.min_bytes = options.history_read_min_bytes;
      ho.streams = options.history_read_streams;
      loop->history_reader_ = std::make_unique<HistoryReader>(*cache, loop->namespace_, *loop->cache_backoff_, ho);
    }
    if (local_prefill && options.local_prefill_max_tokens > 0) {
      loop->local_prefill_ = std::make_unique<LocalPrefill>(*cache, loop->namespace_, *loop->cache_backoff_,
                                                            options.local_prefill_max_tokens, std::move(local_prefill));
    }
  }
  std::unique_ptr<cachestore::CachePublisher> publisher;
  if (cache != nullptr && options.publish) {
    cachestore::PublisherOptions po;
    // At most max_batch turn ends wait to start, 2 * max_batch in all.
    po.max_queued = options.max_batch;
    po.max_in_flight = 2 * options.max_batch;
    po.parent_wait = options.publish_parent_wait;
    po.backoff = loop->cache_backoff_;
    ASSIGN_OR_RETURN(publisher, cachestore::CachePublisher::Create(*cache, po));
  }
  loop->turn_end_ = std::make_unique<TurnEnd>(model_fingerprint, loop->namespace_, std::move(publisher));
  loop->loop_ = std::thread([p = loop.get()] { p->Run(); });
  return loop;
}

DecodeLoop::DecodeLoop(engine::Model& model, const common::Hash128& fingerprint, prefill::PrefillClient& prefill,
                       transport::StateReceiver& receiver, const DecodeLoopOptions& options)
    : model_(model),
      prefill_(prefill),
      namespace_{fingerprint.ToHex(), options.adapter, static_cast<int32_t>(model.page_size()),
                 engine::ModelPrefillCost(model.config())},
      receiver_(receiver),
      options_(options) {}

DecodeLoop::~DecodeLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (loop_.joinable()) loop_.join();
  turn_end_.reset();  // after the publications already queued; waits for parents give up
  absl::flat_hash_map<uint64_t, std::thread> calls;
  {
    absl::MutexLock lock(&mu_);
    calls.swap(calls_);
  }
  for (auto& [id, t] : calls) t.join();
  // Every call has returned: nothing writes into these reservations any more.
  absl::flat_hash_map<uint64_t, engine::SequenceId> deferred;
  {
    absl::MutexLock lock(&mu_);
    deferred.swap(deferred_aborts_);
  }
  for (const auto& [transfer_id, reservation] : deferred) (void)model_.sequences().AbortImport(reservation);
}

absl::Status DecodeLoop::Submit(GenerateRequest request, GenerationSink* sink) {
  RETURN_IF_ERROR(ValidateRequest(request, model_.config().vocab_size, max_context()));
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.stop.max_tokens;
  if (model_.sequences().PagesFor(total) > model_.sequences().num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat("a request of ", total, " tokens needs ",
                                                     model_.sequences().PagesFor(total), " KV pages, this worker has ",
                                                     model_.sequences().num_pages()));
  }
  auto r = std::make_unique<Request>();
  absl::StatusOr<engine::Sampler> sampler = engine::Sampler::Create(request.sampling);
  if (!sampler.ok()) return absl::InvalidArgumentError(absl::StrCat("sampling: ", sampler.status().message()));
  r->sampler = *std::move(sampler);
  r->sink = sink;
  r->key = ScopedRequestId(request.tenant, request.request_id);
  r->req = std::move(request);
  absl::MutexLock lock(&mu_);
  if (draining_ || stop_) return absl::UnavailableError("the decode worker is draining");
  if (live_.contains(r->key)) {
    // The client's id: the scoped form would show the tenant.
    return absl::InvalidArgumentError(absl::StrCat("request_id \"", r->req.request_id, "\" is already live"));
  }
  if (static_cast<int64_t>(waiting_.size()) + prefilling_ + decoding_ >= options_.max_batch + options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat("the decode worker is full: ", waiting_.size(),
                                                     " requests waiting, ", prefilling_ + decoding_, " running"));
  }
  waiting_.push_back(r->key);
  std::string key = r->key;
  live_.emplace(std::move(key), std::move(r));
  return absl::OkStatus();
}

bool DecodeLoop::Abort(absl::string_view tenant, absl::string_view request_id) {
  std::string key = ScopedRequestId(tenant, request_id);
  absl::MutexLock lock(&mu_);
  if (!live_.contains(key)) return false;
  aborts_.insert(std::move(key));
  return true;
}

void DecodeLoop::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

int64_t DecodeLoop::max_context() const {
  const int64_t positions = model_.config().max_position_embeddings;
  return positions > 0 ? std::min(positions, engine::kMaxSequenceTokens) : engine::kMaxSequenceTokens;
}

DecodeLoop::Counts DecodeLoop::counts() const {
  absl::MutexLock lock(&mu_);
  Counts c;
  c.waiting = static_cast<int64_t>(waiting_.size());
  c.prefilling = prefilling_;
  c.decoding = decoding_;
  c.free_pages = free_pages_;
  c.free_slots = free_slots_;
  c.batch_peak = batch_peak_;
  c.orphaned_calls = static_cast<int64_t>(orphaned_calls_.size());
  c.history_pages = history_pages_;
  if (history_reader_ != nullptr) {
    const HistoryReader::Counts h = history_reader_->counts();
    c.history_reads = h.reads;
    c.history_failures = h.failures;
  }
  if (local_prefill_ != nullptr) {
    const LocalPrefill::Counts l = local_prefill_->counts();
    c.local_prefills = l.prefills;
    c.local_prefill_failures = l.failures;
    c.local_prefill_tokens = l.tokens;
    c.local_prefill_resume = l.resume;
    c.local_prefill_compute = l.compute;
  }
  c.fallback_prefills_unavailable = fallback_unavailable_;
  c.fallback_prefills_failed = fallback_failed_;
  c.fallback_prefill_failures = fallback_failures_;
  return c;
}

bool DecodeLoop::Idle() const {
  absl::MutexLock lock(&mu_);
  // A returned call's deferred abort (its reservation) is freed by the loop
  // thread after the call has left orphaned_calls_.
  return live_.empty() && orphaned_calls_.empty() && deferred_aborts_.empty() && turn_end_->in_flight() == 0;
}

void DecodeLoop::JoinFinishedCalls() {
  std::vector<std::thread> done;
  std::vector<std::pair<uint64_t, engine::SequenceId>> aborts;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_calls_) {
      auto it = calls_.find(id);
      if (it == calls_.end()) continue;
      done.push_back(std::move(it->second));
      calls_.erase(it);
      if (auto d = deferred_aborts_.find(id); d != deferred_aborts_.end()) aborts.emplace_back(id, d->second);
    }
    finished_calls_.clear();
  }
  for (std::thread& t : done) t.join();
  // Their calls have returned: no write into these pages is left. They leave
  // deferred_aborts_ (and so Idle) only once freed.
  for (const auto& [id, reservation] : aborts) (void)model_.sequences().AbortImport(reservation);
  absl::MutexLock lock(&mu_);
  for (const auto& [id, reservation] : aborts) deferred_aborts_.erase(id);
}

void DecodeLoop::Run() {
  while (true) {
    JoinFinishedCalls();
    std::vector<std::string> aborts;
    std::vector<Prefilled> arrived;
    std::vector<std::string> expired;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !aborts_.empty() || !prefilled_.empty() || decoding_ > 0 ||
               (!waiting_.empty() && Running() < options_.max_batch);
      };
      // Wakes at least every 50 ms for deadlines and for room freed elsewhere.
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(50));
      stop = stop_;
      aborts.assign(aborts_.begin(), aborts_.end());
      aborts_.clear();
      arrived.swap(prefilled_);
      const absl::Time now = absl::Now();
      for (const auto& [id, r] : live_) {
        if (r->req.deadline <= now) expired.push_back(id);
      }
    }
    if (stop) {
      std::vector<std::string> all;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [id, r] : live_) all.push_back(id);
      }
      for (const std::string& id : all) {
        Finish(id, FinishReason::kAborted, absl::CancelledError("the decode worker is shutting down"));
      }
      return;
    }
    for (const std::string& id : aborts) Finish(id, FinishReason::kAborted, absl::CancelledError("aborted"));
    for (const std::string& id : expired) {
      Finish(id, FinishReason::kAborted, absl::DeadlineExceededError("the request's deadline passed"));
    }
    for (Prefilled& p : arrived) Import(std::move(p));
    Admit();
    Step();
    const int64_t free_pages = model_.sequences().num_free_pages();
    const int64_t free_slots = model_.sequences().num_free_slots();
    absl::MutexLock lock(&mu_);
    free_pages_ = free_pages;
    free_slots_ = free_slots;
  }
}

void DecodeLoop::Admit() {
  while (true) {
    Request* r = nullptr;
    uint64_t transfer_id = 0;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_.empty() || Running() >= options_.max_batch) return;
      r = live_.at(waiting_.front()).get();
      transfer_id = next_transfer_;
    }
    if (PrefillHere(*r)) continue;
    engine::SequenceTable& table = model_.sequences();
    const int64_t prompt = static_cast<int64_t>(r->req.prompt.size());
    absl::StatusOr<engine::ImportReservation> reservation = table.ReserveImport(prompt);
    if (!reservation.ok()) return;  // no room yet: waits for a request to end
    if (!table.ReservePages(reservation->id, prompt + r->req.stop.max_tokens).ok()) {
      (void)table.AbortImport(reservation->id);
      return;
    }
    const absl::Time deadline = std::min(r->req.deadline, absl::Now() + options_.transfer_timeout);
    absl::StatusOr<transport::Ticket> ticket =
        transport::TicketFor(table, *reservation, transfer_id, options_.endpoint, deadline);
    // The receiver completes the ticket for its plane (its kind, the
    // per-transfer secret the sender must present; NCCL: the channel's id).
    // Device planes take the reserved slots too, so the pages land there
    // without a host copy (transfer.h, "Pages in place").
    const absl::Status expected =
        ticket.ok() ? transport::ExpectReservation(receiver_, &*ticket, table, *reservation) : ticket.status();
    r->reservation = *reservation;
    if (!expected.ok()) {
      (void)table.AbortImport(reservation->id);
      Finish(r->key, FinishReason::kError, expected);
      continue;
    }
    // Pages this worker reads from the cache itself, on the call's thread.
    HistoryReader::PageViews history;
    if (history_reader_ != nullptr) history = history_reader_->Views(table, *reservation, *ticket);
    r->reads_history = !history.empty();
    r->ticket = *ticket;
    r->phase = Request::Phase::kPrefilling;
    r->cancellation = std::make_shared<common::Cancellation>();
    prefill::PrefillRequest call = PrefillCallFor(r->req);
    call.ticket = *ticket;
    call.cancellation = r->cancellation;
    // While calls fail, one this worker can prefill itself does not wait for
    // an unreachable pool to come back (--prefill_unavailable_wait): it is
    // prefilled here at once, and the pool is called again by the next one.
    call.skip_unavailable_wait = pool_failing_ && fallback_prefill_ &&
                                 static_cast<int64_t>(r->req.prompt.size()) <= options_.fallback_prefill_max_tokens;
    absl::MutexLock lock(&mu_);
    waiting_.pop_front();
    ++prefilling_;
    ++next_transfer_;
    calls_running_.insert(transfer_id);
    calls_[transfer_id] =
        std::thread([this, transfer_id, key = r->key, call = std::move(call), history = std::move(history)]() mutable {
          const int64_t held = history.empty() ? 0 : history_reader_->Read(call, history);
          call.ticket.held_pages = held;  // prefill sends the pages after them
          absl::StatusOr<prefill::PrefillOutcome> outcome = prefill_.Prefill(call);
          absl::MutexLock done(&mu_);
          prefilled_.push_back(Prefilled{std::move(key), std::move(outcome), held});
          finished_calls_.push_back(transfer_id);
          calls_running_.erase(transfer_id);
          orphaned_calls_.erase(transfer_id);
        });
  }
}

bool DecodeLoop::PrefillHere(Request& r) {
  if (local_prefill_ == nullptr) return false;
  {
    absl::MutexLock lock(&mu_);
    if (decoding_ > 0 && !options_.local_prefill_while_decoding) return false;
  }
  std::optional<prefill::KeptPrefill> kept = local_prefill_->TryPrefill(r.req, model_.sequences());
  if (!kept.has_value()) return false;
  r.reservation = engine::ImportReservation();
  r.reservation.id = kept->seq;
  r.reservation.n_tokens = static_cast<int64_t>(r.req.prompt.size());
  r.prefill = std::move(kept->outcome);
  r.phase = Request::Phase::kDecoding;
  {
    absl::MutexLock lock(&mu_);
    waiting_.pop_front();
    ++decoding_;
  }
  batch_.push_back(r.key);
  Emit(r, r.prefill.first);
  return true;
}

void DecodeLoop::Import(Prefilled prefilled) {
  Request* r = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(prefilled.key);
    if (it == live_.end() || it->second->phase != Request::Phase::kPrefilling) return;  // ended meanwhile
    r = it->second.get();
  }
  if (!prefilled.outcome.ok()) {
    // The call's deadline was the request's own (not the transfer timeout):
    // the request ran out of time, as if the loop had seen it expire first.
    if (prefilled.outcome.status().code() == absl::StatusCode::kDeadlineExceeded &&
        r->req.deadline <= r->ticket.deadline) {
      Finish(r->key, FinishReason::kAborted,
             absl::DeadlineExceededError("the request's deadline passed while it was prefilled"));
      return;
    }
    FallBack(*r, prefilled.outcome.status());
    return;
  }
  absl::StatusOr<transport::ReceivedState> received = receiver_.Await(r->ticket.transfer_id);
  absl::Status imported =
      received.ok() ? transport::ImportReceived(model_.sequences(), r->reservation, *received, prefilled.held_pages)
                    : received.status();
  if (!imported.ok()) {
    FallBack(*r, imported);
    return;
  }
  if (pool_failing_) {
    pool_failing_ = false;
    LOG(INFO) << "the prefill pool answers again: requests are prefilled there";
  }
  if (received->first_page > 0) {
    absl::MutexLock lock(&mu_);
    history_pages_ += received->first_page;  // read here, kept: prefill sent the pages after them
  }
  r->prefill = *prefilled.outcome;
  r->phase = Request::Phase::kDecoding;
  {
    absl::MutexLock lock(&mu_);
    --prefilling_;
    ++decoding_;
  }
  batch_.push_back(r->key);
  Emit(*r, r->prefill.first);
}

void DecodeLoop::FallBack(Request& r, const absl::Status& failure) {
  const absl::StatusCode code = failure.code();
  const int64_t prompt = static_cast<int64_t>(r.req.prompt.size());
  const int64_t limit = options_.fallback_prefill_max_tokens;
  // Refused for its input: prefilling it here would refuse it the same way.
  if (!fallback_prefill_ || code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kOutOfRange) {
    Finish(r.key, FinishReason::kError, failure);
    return;
  }
  if (prompt > limit) {
    Finish(r.key, FinishReason::kError,
           absl::Status(code, absl::StrCat(failure.message(), "; not prefilled here instead: the prompt's ", prompt,
                                           " tokens exceed fallback_prefill_max_tokens (", limit, ")")));
    return;
  }
  if (!pool_failing_) {
    pool_failing_ = true;
    LOG(WARNING) << "a prefill call failed (" << failure << "): requests whose call fails are prefilled here, "
                 << "prompts of up to " << limit << " tokens, until the prefill pool answers again";
  }
  // The call has returned: nothing writes into the reservation any more.
  engine::SequenceTable& table = model_.sequences();
  receiver_.Cancel(r.ticket.transfer_id);  // late bytes are refused
  (void)table.AbortImport(r.reservation.id);
  r.reservation = engine::ImportReservation();
  absl::StatusOr<prefill::KeptPrefill> kept = fallback_prefill_(PrefillCallFor(r.req), prompt + r.req.stop.max_tokens);
  {
    absl::MutexLock lock(&mu_);
    ++(code == absl::StatusCode::kUnavailable ? fallback_unavailable_ : fallback_failed_);
    if (!kept.ok()) ++fallback_failures_;
  }
  if (!kept.ok()) {
    // Its reservation is freed already: Finish's abort of id 0 (never a
    // sequence's) finds nothing.
    Finish(r.key, FinishReason::kError,
           absl::Status(kept.status().code(), absl::StrCat("prefilling here after the prefill call failed (",
                                                           failure.message(), "): ", kept.status().message())));
    return;
  }
  r.reservation.id = kept->seq;
  r.reservation.n_tokens = prompt;
  r.prefill = std::move(kept->outcome);
  r.phase = Request::Phase::kDecoding;
  {
    absl::MutexLock lock(&mu_);
    --prefilling_;
    ++decoding_;
  }
  batch_.push_back(r.key);
  Emit(r, r.prefill.first);
}

void DecodeLoop::Emit(Request& r, const engine::SampledToken& token) {
  r.generated.push_back(token.token);
  r.sink->OnToken(token);
  TokenId stop_token = -1;
  if (std::optional<FinishReason> reason = StopReason(r.req.stop, options_.eos_token_ids, r.generated, &stop_token)) {
    Finish(r.key, *reason, absl::OkStatus(), stop_token);
  }
}

void DecodeLoop::Step() {
  if (batch_.empty()) return;
  std::vector<Request*> requests;
  std::vector<engine::SequenceId> ids;
  std::vector<TokenId> tokens;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : batch_) {
      Request* r = live_.at(id).get();
      requests.push_back(r);
      ids.push_back(r->reservation.id);
      tokens.push_back(r->generated.back());
    }
    batch_peak_ = std::max(batch_peak_, static_cast<int64_t>(ids.size()));
  }
  absl::StatusOr<std::vector<float>> logits = model_.DecodeStep(ids, tokens);
  if (!logits.ok()) {
    LOG(ERROR) << "decode step failed for a batch of " << ids.size() << ": " << logits.status();
    for (Request* r : requests) Finish(r->key, FinishReason::kError, logits.status());
    return;
  }
  const int64_t vocab = model_.config().vocab_size;
  for (size_t b = 0; b < requests.size(); ++b) {
    Request& r = *requests[b];
    absl::StatusOr<engine::SampledToken> token = r.sampler->Sample(
        absl::MakeConstSpan(*logits).subspan(b * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
        static_cast<int64_t>(r.generated.size()));
    if (!token.ok()) {
      Finish(r.key, FinishReason::kError, token.status());
      continue;
    }
    Emit(r, *token);
  }
}

void DecodeLoop::Finish(const std::string& key, FinishReason reason, absl::Status error, TokenId stop_token) {
  std::unique_ptr<Request> r;
  bool abort_deferred = false;  // its reservation is freed once its call has returned
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(key);
    if (it == live_.end()) return;
    r = std::move(it->second);
    live_.erase(it);
    switch (r->phase) {
      case Request::Phase::kWaiting:
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), key));
        break;
      case Request::Phase::kPrefilling:
        --prefilling_;
        // Its call still runs: it keeps a place in the batch (and in the
        // prefill worker's queue) until it returns, which its cancellation
        // below makes soon.
        if (calls_running_.contains(r->ticket.transfer_id)) {
          orphaned_calls_.insert(r->ticket.transfer_id);
          // It may still be writing the prompt's cached pages into the
          // reservation: freed once it has returned (JoinFinishedCalls).
          if (r->reads_history) {
            deferred_aborts_.emplace(r->ticket.transfer_id, r->reservation.id);
            abort_deferred = true;
          }
        }
        break;
      case Request::Phase::kDecoding:
        --decoding_;
        break;
    }
  }
  r->ended = absl::Now();
  if (reason == FinishReason::kError) {
    int64_t held_back = 0;
    if (log_limiter_.Allow(absl::StrCat("request ", common::FailureReason(error)), &held_back)) {
      LOG(WARNING) << "request " << r->req.request_id << " failed: " << error << common::HeldBack(held_back);
    }
  }
  Completion c;
  c.reason = reason;
  c.stop_token_id = stop_token;
  c.error = std::move(error);
  c.usage = UsageOf(r->req, static_cast<int64_t>(r->generated.size()), r->prefill.usage);
  engine::SequenceTable& table = model_.sequences();
  if (r->phase == Request::Phase::kPrefilling) {
    if (r->cancellation != nullptr) r->cancellation->Cancel();  // the prefill call stops within a segment
    receiver_.Cancel(r->ticket.transfer_id);                    // late bytes are refused
    if (!abort_deferred) (void)table.AbortImport(r->reservation.id);
  } else if (r->phase == Request::Phase::kDecoding) {
    batch_.erase(std::find(batch_.begin(), batch_.end(), key));
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
      turn_end_->End(table, r->reservation.id, std::move(r->req), r->generated, r->prefill.publishes_prompt, *r->sink,
                     std::move(c), r->ended);
      return;
    }
    (void)table.Release(r->reservation.id);
  }
  r->sink->OnComplete(c);
}

}  // namespace hybridserve::decode
