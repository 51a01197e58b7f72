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
#include "cachestore/cache_plan.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transport/engine_import.h"

namespace hybridserve::decode {

void PrefillCancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (on_cancel_) on_cancel_();
}

bool PrefillCancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void PrefillCancellation::OnCancel(std::function<void()> on_cancel) {
  absl::MutexLock lock(&mu_);
  on_cancel_ = std::move(on_cancel);
  if (cancelled_ && on_cancel_) on_cancel_();
}

bool PrefillCancellation::WaitFor(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
}

struct DecodeLoop::Request {
  enum class Phase { kWaiting, kPrefilling, kDecoding };

  GenerateRequest req;
  GenerationSink* sink = nullptr;
  std::optional<engine::Sampler> sampler;
  Phase phase = Phase::kWaiting;
  engine::ImportReservation reservation;  // from admission on
  transport::Ticket ticket;
  std::shared_ptr<PrefillCancellation> cancellation;  // of the prefill call
  PrefillReply prefill;
  std::vector<TokenId> generated;
  absl::Time ended;  // when Finish took it out of the batch
};

absl::StatusOr<std::unique_ptr<DecodeLoop>> DecodeLoop::Create(
    engine::Model& model, const common::Hash128& model_fingerprint, PrefillClient& prefill,
    transport::StateReceiver& receiver, cachestore::CacheClient* cache, const DecodeLoopOptions& options) {
  if (options.max_batch < 1 || options.max_waiting < 0 || options.transfer_timeout <= absl::ZeroDuration() ||
      options.publish_parent_wait < absl::ZeroDuration() || options.cache_failure_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "decode loop: max_batch >= 1, max_waiting >= 0, a positive transfer_timeout, a publish_parent_wait >= 0 and "
        "a cache_failure_backoff >= 0");
  }
  std::unique_ptr<DecodeLoop> loop(new DecodeLoop(model, model_fingerprint, prefill, receiver, cache, options));
  loop->loop_ = std::thread([p = loop.get()] { p->Run(); });
  loop->publisher_ = std::thread([p = loop.get()] { p->PublishLoop(); });
  return loop;
}

DecodeLoop::DecodeLoop(engine::Model& model, const common::Hash128& fingerprint, PrefillClient& prefill,
                       transport::StateReceiver& receiver, cachestore::CacheClient* cache,
                       const DecodeLoopOptions& options)
    : model_(model),
      fingerprint_(fingerprint),
      prefill_(prefill),
      receiver_(receiver),
      cache_(cache),
      options_(options) {}

DecodeLoop::~DecodeLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (loop_.joinable()) loop_.join();
  {
    absl::MutexLock lock(&mu_);
    stop_publisher_ = true;  // after the publications already queued
  }
  if (publisher_.joinable()) publisher_.join();
  absl::flat_hash_map<uint64_t, std::thread> calls;
  {
    absl::MutexLock lock(&mu_);
    calls.swap(calls_);
  }
  for (auto& [id, t] : calls) t.join();
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
  r->req = std::move(request);
  absl::MutexLock lock(&mu_);
  if (draining_ || stop_) return absl::UnavailableError("the decode worker is draining");
  if (live_.contains(r->req.request_id)) {
    return absl::InvalidArgumentError(absl::StrCat("request_id \"", r->req.request_id, "\" is already live"));
  }
  if (static_cast<int64_t>(waiting_.size()) + prefilling_ + decoding_ >= options_.max_batch + options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat("the decode worker is full: ", waiting_.size(),
                                                     " requests waiting, ", prefilling_ + decoding_, " running"));
  }
  waiting_.push_back(r->req.request_id);
  live_.emplace(r->req.request_id, std::move(r));
  return absl::OkStatus();
}

bool DecodeLoop::Abort(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (!live_.contains(request_id)) return false;
  aborts_.insert(request_id);
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
  return Counts{
      static_cast<int64_t>(waiting_.size()),       prefilling_, decoding_, free_pages_, free_slots_, batch_peak_,
      static_cast<int64_t>(orphaned_calls_.size())};
}

bool DecodeLoop::Idle() const {
  absl::MutexLock lock(&mu_);
  return live_.empty() && publications_.empty() && publishing_ == 0 && orphaned_calls_.empty();
}

void DecodeLoop::JoinFinishedCalls() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : finished_calls_) {
      auto it = calls_.find(id);
      if (it == calls_.end()) continue;
      done.push_back(std::move(it->second));
      calls_.erase(it);
    }
    finished_calls_.clear();
  }
  for (std::thread& t : done) t.join();
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
    // The receiver completes the ticket for its plane (its kind; NCCL: the
    // channel's id). Device planes take the reserved slots too, so the pages
    // land there without a host copy (transfer.h, "Pages in place").
    absl::Status expected = ticket.status();
    if (ticket.ok()) {
      const transport::TransportKind plane = receiver_.kind();
      if (plane == transport::TransportKind::kNccl || plane == transport::TransportKind::kCudaIpc) {
        auto sink = transport::ReservationPageSink::Create(table, *reservation);
        expected = sink.ok() ? receiver_.ExpectTicketInPlace(&*ticket, *std::move(sink)) : sink.status();
      } else {
        expected = receiver_.ExpectTicket(&*ticket);
      }
    }
    r->reservation = *reservation;
    if (!expected.ok()) {
      (void)table.AbortImport(reservation->id);
      Finish(r->req.request_id, FinishReason::kError, expected);
      continue;
    }
    r->ticket = *ticket;
    r->phase = Request::Phase::kPrefilling;
    r->cancellation = std::make_shared<PrefillCancellation>();
    PrefillCall call;
    call.request_id = r->req.request_id;
    call.prompt = r->req.prompt;
    call.cache_salt = r->req.cache_salt;
    call.sampling = r->req.sampling;
    call.ticket = *ticket;
    call.deadline = deadline;
    call.cancellation = r->cancellation;
    absl::MutexLock lock(&mu_);
    waiting_.pop_front();
    ++prefilling_;
    ++next_transfer_;
    calls_running_.insert(transfer_id);
    calls_[transfer_id] = std::thread([this, transfer_id, call = std::move(call)] {
      absl::StatusOr<PrefillReply> reply = prefill_.Prefill(call);
      absl::MutexLock done(&mu_);
      prefilled_.push_back(Prefilled{call.request_id, std::move(reply)});
      finished_calls_.push_back(transfer_id);
      calls_running_.erase(transfer_id);
      orphaned_calls_.erase(transfer_id);
    });
  }
}

void DecodeLoop::Import(Prefilled prefilled) {
  Request* r = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(prefilled.request_id);
    if (it == live_.end() || it->second->phase != Request::Phase::kPrefilling) return;  // ended meanwhile
    r = it->second.get();
  }
  if (!prefilled.reply.ok()) {
    // The call's deadline was the request's own (not the transfer timeout):
    // the request ran out of time, as if the loop had seen it expire first.
    if (prefilled.reply.status().code() == absl::StatusCode::kDeadlineExceeded &&
        r->req.deadline <= r->ticket.deadline) {
      Finish(r->req.request_id, FinishReason::kAborted,
             absl::DeadlineExceededError("the request's deadline passed while it was prefilled"));
      return;
    }
    Finish(r->req.request_id, FinishReason::kError, prefilled.reply.status());
    return;
  }
  absl::StatusOr<transport::ReceivedState> received = receiver_.Await(r->ticket.transfer_id);
  absl::Status imported =
      received.ok() ? transport::ImportReceived(model_.sequences(), r->reservation, *received) : received.status();
  if (!imported.ok()) {
    Finish(r->req.request_id, FinishReason::kError, imported);
    return;
  }
  r->prefill = *prefilled.reply;
  r->phase = Request::Phase::kDecoding;
  {
    absl::MutexLock lock(&mu_);
    --prefilling_;
    ++decoding_;
  }
  batch_.push_back(r->req.request_id);
  Emit(*r, r->prefill.first);
}

void DecodeLoop::Emit(Request& r, const engine::SampledToken& token) {
  r.generated.push_back(token.token);
  r.sink->OnToken(token);
  const StopConditions& stop = r.req.stop;
  const bool eos = !stop.ignore_eos && std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(),
                                                 token.token) != options_.eos_token_ids.end();
  const bool stop_id =
      std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token.token) != stop.stop_token_ids.end();
  if (eos || stop_id) {
    Finish(r.req.request_id, FinishReason::kStop, absl::OkStatus(), token.token);
    return;
  }
  for (const std::vector<TokenId>& seq : stop.stop_sequences) {
    if (seq.size() <= r.generated.size() && std::equal(seq.rbegin(), seq.rend(), r.generated.rbegin())) {
      Finish(r.req.request_id, FinishReason::kStop, absl::OkStatus());
      return;
    }
  }
  if (static_cast<int64_t>(r.generated.size()) >= stop.max_tokens) {
    Finish(r.req.request_id, FinishReason::kLength, absl::OkStatus());
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
  }
  {
    absl::MutexLock lock(&mu_);
    batch_peak_ = std::max(batch_peak_, static_cast<int64_t>(ids.size()));
  }
  absl::StatusOr<std::vector<float>> logits = model_.DecodeStep(ids, tokens);
  if (!logits.ok()) {
    LOG(ERROR) << "decode step failed for a batch of " << ids.size() << ": " << logits.status();
    for (Request* r : requests) Finish(r->req.request_id, FinishReason::kError, logits.status());
    return;
  }
  const int64_t vocab = model_.config().vocab_size;
  for (size_t b = 0; b < requests.size(); ++b) {
    Request& r = *requests[b];
    absl::StatusOr<engine::SampledToken> token = r.sampler->Sample(
        absl::MakeConstSpan(*logits).subspan(b * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
        static_cast<int64_t>(r.generated.size()));
    if (!token.ok()) {
      Finish(r.req.request_id, FinishReason::kError, token.status());
      continue;
    }
    Emit(r, *token);
  }
}

// What the loop thread hands the publisher: the request (for its sink), its
// completion, and the bytes to put, copied out of the engine before the
// sequence was released; then how far the puts have got.
struct DecodeLoop::Publication {
  std::unique_ptr<Request> request;
  Completion completion;
  cachestore::ClientNamespace ns;
  std::vector<std::pair<cachestore::ClientPut, std::string>> pages;
  cachestore::ClientPut state_put;
  std::string state;
  absl::Status prepared;             // not OK: nothing to put, and why
  bool parent_from_prefill = false;  // the first put's parent is prefill's to put
  // Progress: the entries put so far (the pages in order, then the state).
  size_t next = 0;
  // Waiting for a parent page that another writer (prefill, or a concurrent
  // request with the same history) is putting: until parent_deadline, the
  // next try at retry_at.
  absl::Time parent_deadline = absl::InfiniteFuture();
  absl::Time retry_at = absl::InfinitePast();
  absl::Duration backoff = absl::Milliseconds(1);
  bool other_writer = false;  // a page put came back ABORTED
  // pages holds every full page from page 0: the publisher first asks the
  // cache which it lacks (a probe), off the loop thread.
  bool probe_first = false;
};

void DecodeLoop::Prepare(const Request& r, Publication* p) {
  // The tokens fed to the model: the prompt and every generated token but the
  // last (sampled, not yet processed).
  std::vector<TokenId> fed = r.req.prompt;
  fed.insert(fed.end(), r.generated.begin(), r.generated.end() - 1);
  const int64_t position = static_cast<int64_t>(fed.size());
  p->ns.model_fingerprint = fingerprint_.ToHex();
  p->ns.adapter = options_.adapter;
  p->ns.cache_salt = r.req.cache_salt;
  p->ns.page_size = static_cast<int32_t>(model_.page_size());
  const cachestore::CachePlan plan(p->ns, fed);
  const int64_t ps = plan.page_size();
  // Every full page is put, a model without attention layers included: its
  // pages hold no bytes but chain the prefix the state hangs from.
  const int64_t full = position / ps;
  // Prefill puts the prompt's full pages (after its answer, so perhaps not
  // yet): the pages past them are ours. Putting copies of prefill's pages
  // too would race its puts of the same entries (ABORTED on both sides) and
  // move every prompt byte twice. When prefill does not publish (it found
  // the cache unreachable, or has none), every page is copied here and the
  // publisher puts those the cache lacks: the loop thread never waits on the
  // cache (a slow one would stall the whole batch), only on the copy.
  int64_t first = static_cast<int64_t>(r.req.prompt.size()) / ps;
  if (r.prefill.prefill_publishes_prompt) {
    p->parent_from_prefill = true;
  } else {
    first = 0;
    p->probe_first = true;
  }
  for (int64_t i = first; i < full; ++i) {
    absl::StatusOr<std::string> page = model_.sequences().ExportPage(r.reservation.id, i);
    if (!page.ok()) {
      p->prepared = page.status();
      return;
    }
    p->pages.emplace_back(plan.PagePut(i), *std::move(page));
  }
  p->prepared = model_.sequences().EncodeStateInto(r.reservation.id, /*with_logits=*/true, fingerprint_,
                                                   plan.StateKeyAt(position), &p->state);
  p->state_put = plan.StatePut(position, cachestore::StateKind::kExactPrefix);
  p->state_put.ttl = r.req.session_keep;
  p->state_put.pin = r.req.session_pin;
}

bool DecodeLoop::Publish(Publication& p) {
  PublicationReport& report = p.completion.publication;
  SessionOutcome& outcome = p.completion.usage.session;
  const bool pin = p.request->req.session_pin;
  auto failed = [&](absl::string_view reason, absl::string_view why) {
    report.failure = std::string(reason);
    if (pin) outcome.pin_refused = absl::StrCat("the turn-end state was not published: ", why);
    return true;
  };
  if (!p.prepared.ok()) return failed("export", p.prepared.message());
  // A cache that timed out lately is skipped, without a call, for a while.
  if (absl::Now() < cache_down_until_) {
    return failed("unavailable", "the cachestore did not answer lately: publications are skipped for a moment");
  }
  // A call that timed out (a hung cachestore, not a dead one: that refuses at
  // once and costs nothing) starts the skip; true when it did.
  auto timed_out = [&](const absl::Status& s) {
    if (s.code() != absl::StatusCode::kDeadlineExceeded || options_.cache_failure_backoff <= absl::ZeroDuration()) {
      return false;
    }
    cache_down_until_ = absl::Now() + options_.cache_failure_backoff;
    return true;
  };
  if (p.probe_first) {
    // Which of the pages (all of them, from page 0) the cache lacks. A failed
    // probe puts them all: those present answer already_present.
    p.probe_first = false;
    std::vector<TokenId> fed;
    for (const auto& [put, bytes] : p.pages) fed.insert(fed.end(), put.tokens.begin(), put.tokens.end());
    absl::StatusOr<cachestore::LookupResult> probe = cache_->Lookup(p.ns, fed, cachestore::LookupMode::kProbeOnly);
    if (timed_out(probe.status())) return failed(common::FailureReason(probe.status()), probe.status().message());
    if (probe.ok()) {
      p.next = std::min(p.pages.size(), static_cast<size_t>(probe->kv_match_tokens / p.ns.page_size));
      for (size_t i = 0; i < p.next; ++i) std::string().swap(p.pages[i].second);  // present: free the copy
    }
  }
  const size_t total = p.pages.size() + 1;
  while (p.next < total) {
    const bool is_page = p.next < p.pages.size();
    const cachestore::ClientPut& what = is_page ? p.pages[p.next].first : p.state_put;
    absl::string_view bytes = is_page ? absl::string_view(p.pages[p.next].second) : absl::string_view(p.state);
    absl::StatusOr<cachestore::PutResult> r = cache_->Put(p.ns, what, bytes);
    timed_out(r.status());
    if (r.ok()) {
      if (!is_page) {
        outcome.published = true;
        outcome.keep = r->ttl;
        outcome.pinned = r->pinned;
        outcome.pin_refused = r->pin_refused;
      } else if (!r->already_present) {
        ++report.pages;
      }
      ++p.next;
      p.backoff = absl::Milliseconds(1);
      continue;
    }
    // ABORTED on a page: the same page is being put by another writer (a
    // concurrent request with the same history); its node is there for the
    // next pages once that put commits.
    if (is_page && r.status().code() == absl::StatusCode::kAborted) {
      p.other_writer = true;
      ++p.next;
      continue;
    }
    // FAILED_PRECONDITION is "the parent page is not in the cache": prefill's
    // publication of the prompt (or the other writer's put) may still be on
    // its way. Wait for it, bounded, without holding up other publications.
    const bool parent_expected = p.parent_from_prefill || p.other_writer;
    if (r.status().code() == absl::StatusCode::kFailedPrecondition && parent_expected) {
      bool stopping = false;
      {
        absl::MutexLock lock(&mu_);
        stopping = stop_;
      }
      const absl::Time now = absl::Now();
      if (p.parent_deadline == absl::InfiniteFuture()) p.parent_deadline = now + options_.publish_parent_wait;
      if (!stopping && now + p.backoff <= p.parent_deadline) {
        p.retry_at = now + p.backoff;
        p.backoff = std::min(2 * p.backoff, absl::Milliseconds(50));
        return false;
      }
      if (!stopping) report.parent_wait_expired = true;
    }
    return failed(common::FailureReason(r.status()), r.status().message());
  }
  return true;
}

void DecodeLoop::Complete(std::unique_ptr<Publication> p) {
  PublicationReport& report = p->completion.publication;
  report.wait = absl::Now() - p->request->ended;
  if (!report.failure.empty()) {
    int64_t held_back = 0;
    if (log_limiter_.Allow(absl::StrCat("publication ", report.failure), &held_back)) {
      LOG(WARNING) << "turn-end publication of request " << p->request->req.request_id << " failed (" << report.failure
                   << (report.parent_wait_expired ? ", after waiting for prefill's parent page" : "")
                   << "): the next turn resumes from an earlier state" << common::HeldBack(held_back);
    }
  }
  p->request->sink->OnComplete(p->completion);
  absl::MutexLock lock(&mu_);
  --publishing_;
}

void DecodeLoop::PublishLoop() {
  // Publications waiting for a parent page, by when to try again.
  std::vector<std::unique_ptr<Publication>> parked;
  while (true) {
    std::unique_ptr<Publication> p;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !publications_.empty() || stop_publisher_; };
      if (parked.empty()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        absl::Time due = absl::InfiniteFuture();
        for (const auto& q : parked) due = std::min(due, q->retry_at);
        mu_.AwaitWithDeadline(absl::Condition(&ready), due);
      }
      if (!publications_.empty()) {
        p = std::move(publications_.front());
        publications_.pop_front();
        ++publishing_;
      } else if (stop_publisher_ && parked.empty()) {
        return;  // stopping, and nothing left
      }
    }
    if (p != nullptr) {
      if (Publish(*p)) {
        Complete(std::move(p));
      } else {
        parked.push_back(std::move(p));
      }
    }
    // The parked publications that are due (all of them when stopping:
    // Publish then gives up at once).
    const absl::Time now = absl::Now();
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = stop_publisher_;
    }
    for (size_t i = 0; i < parked.size();) {
      if (!stopping && parked[i]->retry_at > now) {
        ++i;
        continue;
      }
      if (Publish(*parked[i])) {
        Complete(std::move(parked[i]));
        parked.erase(parked.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

void DecodeLoop::Finish(const std::string& request_id, FinishReason reason, absl::Status error, TokenId stop_token) {
  std::unique_ptr<Request> r;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(request_id);
    if (it == live_.end()) return;
    r = std::move(it->second);
    live_.erase(it);
    switch (r->phase) {
      case Request::Phase::kWaiting:
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), request_id));
        break;
      case Request::Phase::kPrefilling:
        --prefilling_;
        // Its call still runs: it keeps a place in the batch (and in the
        // prefill worker's queue) until it returns, which its cancellation
        // below makes soon.
        if (calls_running_.contains(r->ticket.transfer_id)) orphaned_calls_.insert(r->ticket.transfer_id);
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
      LOG(WARNING) << "request " << request_id << " failed: " << error << common::HeldBack(held_back);
    }
  }
  Completion c;
  c.reason = reason;
  c.stop_token_id = stop_token;
  c.error = std::move(error);
  c.usage.prompt_tokens = static_cast<int64_t>(r->req.prompt.size());
  c.usage.completion_tokens = static_cast<int64_t>(r->generated.size());
  c.usage.cached_tokens = r->prefill.cached_tokens;
  c.usage.recomputed_tokens = r->prefill.recomputed_tokens;
  c.usage.resume_kind = r->prefill.resume_kind;
  engine::SequenceTable& table = model_.sequences();
  if (r->phase == Request::Phase::kPrefilling) {
    if (r->cancellation != nullptr) r->cancellation->Cancel();  // the prefill call stops within a segment
    receiver_.Cancel(r->ticket.transfer_id);                    // late bytes are refused
    (void)table.AbortImport(r->reservation.id);
  } else if (r->phase == Request::Phase::kDecoding) {
    batch_.erase(std::find(batch_.begin(), batch_.end(), request_id));
    const bool normal = reason == FinishReason::kStop || reason == FinishReason::kLength;
    if (normal) {
      c.usage.has_session = true;
      if (cache_ != nullptr && options_.publish) {
        // The bytes leave the engine now; the puts, and then the final
        // message, follow on the publisher thread, so the batch does not wait
        // for the cache and the next turn still finds the state.
        c.publication.attempted = true;
        auto p = std::make_unique<Publication>();
        Prepare(*r, p.get());
        (void)table.Release(r->reservation.id);
        p->request = std::move(r);
        p->completion = std::move(c);
        absl::MutexLock lock(&mu_);
        // Backpressure: at most max_batch publications wait to start, and at
        // most 2 * max_batch are in the publisher's hands at once.
        auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const int64_t queued = static_cast<int64_t>(publications_.size());
          return queued < options_.max_batch && queued + publishing_ < 2 * options_.max_batch;
        };
        mu_.Await(absl::Condition(&room));
        publications_.push_back(std::move(p));
        return;
      }
      if (r->req.session_pin)
        c.usage.session.pin_refused = "this decode worker publishes no turn-end states (no cache)";
    }
    (void)table.Release(r->reservation.id);
  }
  r->sink->OnComplete(c);
}

}  // namespace hybridserve::decode
