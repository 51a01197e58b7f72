#ifndef HYBRIDSERVE_DECODE_DECODE_LOOP_TEST_FIXTURE_H_
#define HYBRIDSERVE_DECODE_DECODE_LOOP_TEST_FIXTURE_H_

// What the decode loop's tests share: a second engine playing prefill over
// the in-process data plane (EnginePrefill: can be held, made to fail, to
// claim the prompt's pages, to ignore cancellation), a sink that collects a
// request's stream, cache clients that answer late or not at all, and the
// fixture that wires them to a DecodeLoop over an in-process cache.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_plan.h"
#include "cachestore/client/fault_injecting_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "common/clock.h"
#include "common/runfiles.h"
#include "common/wait_for.h"
#include "decode/decode_loop.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gtest/gtest.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/engine_import.h"
#include "transport/fake_communicator.h"
#include "transport/in_process_transport.h"
#include "transport/routing_sender.h"

namespace hybridserve::decode::test {

using common::Runfile;

inline std::vector<TokenId> Tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<TokenId>((i * 37 + seed * 11 + 5) % vocab);
  return t;
}

// Collects one request's stream.
class Collector : public GenerationSink {
 public:
  void OnToken(const engine::SampledToken& token) override {
    if (on_token_) on_token_(token);
    absl::MutexLock lock(&mu_);
    tokens_.push_back(token.token);
  }
  void OnComplete(const Completion& completion) override {
    if (on_complete_) on_complete_(completion);
    {
      absl::MutexLock lock(&mu_);
      completion_ = completion;
    }
    // Last: a waiter may destroy the collector as soon as Wait returns.
    done_.Notify();
  }
  // Waits (bounded) for the completion.
  bool Wait() { return done_.WaitForNotificationWithTimeout(absl::Seconds(60)); }
  bool done() const { return done_.HasBeenNotified(); }
  std::vector<TokenId> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  Completion completion() {
    absl::MutexLock lock(&mu_);
    return completion_;
  }
  std::function<void(const Completion&)> on_complete_;
  // Runs on the decode loop's thread before the token is kept (may block it).
  std::function<void(const engine::SampledToken&)> on_token_;

 private:
  absl::Mutex mu_;
  std::vector<TokenId> tokens_;
  Completion completion_;
  absl::Notification done_;
};

// Prefill on its own engine: prefill, sample step 0, push. Can be held.
class EnginePrefill : public prefill::PrefillClient {
 public:
  EnginePrefill(engine::Model& model, const common::Hash128& fingerprint, transport::StateSender& sender)
      : model_(model), fingerprint_(fingerprint), sender_(sender) {}

  absl::StatusOr<prefill::PrefillOutcome> Prefill(const prefill::PrefillRequest& call) override {
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      callers_.emplace_back(call.tenant, call.request_id);
      // Held: until released, or (unless told to ignore it) until the call
      // is cancelled, as a prefill worker stops between segments.
      while (!mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Milliseconds(1))) {
        if (!ignore_cancel_ && call.cancellation != nullptr && call.cancellation->cancelled()) {
          ++cancelled_;
          return absl::CancelledError("the request ended before its prefill");
        }
      }
      if (!fail_.ok()) return fail_;
    }
    absl::MutexLock engine(&engine_mu_);
    auto id = model_.sequences().New();
    if (!id.ok()) return id.status();
    auto result = model_.Prefill(*id, call.prompt);
    absl::StatusOr<engine::Sampler> sampler = engine::Sampler::Create(call.sampling);
    absl::StatusOr<engine::SampledToken> first =
        result.ok() && sampler.ok() ? sampler->Sample(result->logits, 0) : absl::InternalError("prefill failed");
    absl::Status s = first.status();
    // It restored nothing from a cache: like a prefill worker, it keeps none
    // of the pages decode holds (transfer.h "Held pages"), unless told to.
    transport::Ticket ticket = call.ticket;
    if (!keeps_held_pages()) ticket.held_pages = 0;
    if (s.ok()) {
      auto source = transport::SequenceStateSource::Create(model_.sequences(), *id, ticket, fingerprint_, {},
                                                           first->token, first->logprob);
      s = source.ok() ? sender_.Send(ticket, *source) : source.status();
    }
    std::vector<std::string> pages;
    if (s.ok() && publishes_prompt()) {
      // What a prefill worker would publish after its answer: the prompt's
      // full pages. The test decides when they reach the cache.
      for (int64_t i = 0; s.ok() && i < static_cast<int64_t>(call.prompt.size()) / model_.page_size(); ++i) {
        absl::StatusOr<std::string> page = model_.sequences().ExportPage(*id, i);
        s = page.status();
        if (page.ok()) pages.push_back(*std::move(page));
      }
    }
    (void)model_.sequences().Release(*id);
    if (!s.ok()) return s;
    prefill::PrefillOutcome reply;
    reply.first = *first;
    reply.usage.recomputed_tokens = 3;  // what a prefill worker reported, passed through
    if (publishes_prompt()) {
      reply.publishes_prompt = true;
      absl::MutexLock lock(&mu_);
      prompt_pages_[call.request_id] = std::move(pages);
    }
    return reply;
  }

  // Claims the prompt's pages as its to publish (PrefillOutcome) and keeps
  // their bytes for prompt_pages(), without putting them.
  void SetPublishesPrompt() {
    absl::MutexLock lock(&mu_);
    publishes_prompt_ = true;
  }
  bool publishes_prompt() {
    absl::MutexLock lock(&mu_);
    return publishes_prompt_;
  }
  // Sends only the pages after those decode holds, as a prefill worker that
  // restored them from the cache would.
  void KeepHeldPages(bool keep = true) {
    absl::MutexLock lock(&mu_);
    keeps_held_pages_ = keep;
  }
  bool keeps_held_pages() {
    absl::MutexLock lock(&mu_);
    return keeps_held_pages_;
  }
  // The prompt pages of the call for `request_id`.
  std::vector<std::string> prompt_pages(const std::string& request_id) {
    absl::MutexLock lock(&mu_);
    return prompt_pages_[request_id];
  }

  void Hold() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void FailWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    fail_ = std::move(s);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Each call's (tenant, request_id), in the order they came.
  std::vector<std::pair<std::string, std::string>> callers() {
    absl::MutexLock lock(&mu_);
    return callers_;
  }
  // Calls that returned CANCELLED while held.
  int cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // Held calls stay held when cancelled (a worker slow to notice).
  void IgnoreCancellation() {
    absl::MutexLock lock(&mu_);
    ignore_cancel_ = true;
  }

 private:
  engine::Model& model_;
  const common::Hash128 fingerprint_;
  transport::StateSender& sender_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status fail_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, std::string>> callers_ ABSL_GUARDED_BY(mu_);
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool ignore_cancel_ ABSL_GUARDED_BY(mu_) = false;
  bool publishes_prompt_ ABSL_GUARDED_BY(mu_) = false;
  bool keeps_held_pages_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::vector<std::string>> prompt_pages_ ABSL_GUARDED_BY(mu_);
  absl::Mutex engine_mu_;  // the engine is not thread-safe
};

// A CacheClient that forwards each of the interface's required calls to
// `inner` (the others keep CacheClient's defaults, built on them): the tests'
// caches below override what they change.
class ForwardingCache : public cachestore::CacheClient {
 public:
  explicit ForwardingCache(cachestore::CacheClient& inner) : inner_(inner) {}
  absl::StatusOr<cachestore::LookupResult> Lookup(const cachestore::ClientNamespace& ns,
                                                  absl::Span<const TokenId> tokens,
                                                  cachestore::LookupMode mode) override {
    return inner_.Lookup(ns, tokens, mode);
  }
  absl::StatusOr<cachestore::PutResult> Put(const cachestore::ClientNamespace& ns, const cachestore::ClientPut& put,
                                            absl::string_view bytes) override {
    return inner_.Put(ns, put, bytes);
  }
  absl::Status GetInto(uint64_t lease_id, const common::Hash128& key, std::string* out) override {
    return inner_.GetInto(lease_id, key, out);
  }
  absl::Status Release(uint64_t lease_id) override { return inner_.Release(lease_id); }
  absl::StatusOr<cachestore::IndexStats> Stats() override { return inner_.Stats(); }

 protected:
  cachestore::CacheClient& inner_;
};

// A cache in front of the real one that records decode's puts and, the first
// time a put finds its parent missing, runs `catch_up` (prefill's late
// publication of the prompt) before answering.
class LatePrefillCache : public ForwardingCache {
 public:
  LatePrefillCache(cachestore::CacheClient& inner, std::function<void()> catch_up)
      : ForwardingCache(inner), catch_up_(std::move(catch_up)) {}

  absl::StatusOr<cachestore::LookupResult> Lookup(const cachestore::ClientNamespace& ns,
                                                  absl::Span<const TokenId> tokens,
                                                  cachestore::LookupMode mode) override {
    absl::MutexLock lock(&mu_);
    ++lookups_;
    return inner_.Lookup(ns, tokens, mode);
  }
  absl::StatusOr<cachestore::PutResult> Put(const cachestore::ClientNamespace& ns, const cachestore::ClientPut& put,
                                            absl::string_view bytes) override {
    absl::StatusOr<cachestore::PutResult> r = inner_.Put(ns, put, bytes);
    absl::MutexLock lock(&mu_);
    if (r.ok() && put.entry_class == cachestore::EntryClass::kPage) page_puts_.push_back(put.tokens);
    if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      ++missing_parent_;
      if (missing_parent_ == 1) catch_up_();
    }
    return r;
  }
  int lookups() {
    absl::MutexLock lock(&mu_);
    return lookups_;
  }
  int missing_parent() {
    absl::MutexLock lock(&mu_);
    return missing_parent_;
  }
  std::vector<std::vector<TokenId>> page_puts() {
    absl::MutexLock lock(&mu_);
    return page_puts_;
  }

 private:
  std::function<void()> catch_up_;
  absl::Mutex mu_;
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int missing_parent_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<TokenId>> page_puts_ ABSL_GUARDED_BY(mu_);
};

// A forwarding cache with a gate: Stall() blocks its caller while the test
// holds the gate (a cachestore that stopped answering), counting who waits.
class StallingCache : public ForwardingCache {
 public:
  explicit StallingCache(cachestore::CacheClient& inner) : ForwardingCache(inner) {}
  void Hold(bool held) {
    absl::MutexLock lock(&mu_);
    held_ = held;
  }
  int blocked() {
    absl::MutexLock lock(&mu_);
    return blocked_;
  }

 protected:
  void Stall() {
    absl::MutexLock lock(&mu_);
    ++blocked_;
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
    --blocked_;
  }

 private:
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

// A cache whose lookups block while held (a cachestore that stopped
// answering), in front of the real one.
class StalledLookupCache : public StallingCache {
 public:
  explicit StalledLookupCache(cachestore::CacheClient& inner) : StallingCache(inner) {}
  absl::StatusOr<cachestore::LookupResult> Lookup(const cachestore::ClientNamespace& ns,
                                                  absl::Span<const TokenId> tokens,
                                                  cachestore::LookupMode mode) override {
    Stall();
    return inner_.Lookup(ns, tokens, mode);
  }
};

class DecodeLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = engine::ModelWeights::LoadDirectory(Runfile("tests/fixtures/golden/nemotron_h_tiny"));
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    vocab_ = weights_->config().vocab_size;
    prefill_model_ = NewModel();
    decode_model_ = NewModel();
    reference_ = NewModel();
    prefill_ = std::make_unique<EnginePrefill>(*prefill_model_, weights_->fingerprint(), transport_);
    auto store = cachestore::CacheStore::Create(cachestore::CacheIndexOptions(), clock_);
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    cache_ = std::make_unique<cachestore::InProcessCacheClient>(*store_);
  }

  std::unique_ptr<engine::Model> NewModel() {
    engine::ModelOptions o;
    o.page_size = 16;
    o.max_pages = 128;
    o.max_sequences = 8;
    auto m = engine::Model::Create(weights_->config(), *weights_, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  void StartLoop(DecodeLoopOptions options = {}, cachestore::CacheClient* cache = nullptr) {
    auto loop = DecodeLoop::Create(*decode_model_, weights_->fingerprint(), *prefill_, transport_,
                                   cache != nullptr ? cache : cache_.get(), options);
    ASSERT_TRUE(loop.ok()) << loop.status();
    loop_ = *std::move(loop);
  }

  GenerateRequest Request(const std::string& id, std::vector<TokenId> prompt, int64_t max_tokens) const {
    GenerateRequest r;
    r.request_id = id;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = max_tokens;
    return r;
  }

  // Greedy tokens of a single-engine run.
  std::vector<TokenId> Alone(const std::vector<TokenId>& prompt, int64_t n) {
    auto id = reference_->sequences().New();
    EXPECT_TRUE(id.ok());
    auto r = reference_->Prefill(*id, prompt);
    EXPECT_TRUE(r.ok());
    std::vector<float> logits = r->logits;
    std::vector<TokenId> out;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 == n) break;
      auto next = reference_->DecodeStep({*id}, {out.back()});
      EXPECT_TRUE(next.ok());
      logits = *next;
    }
    (void)reference_->sequences().Release(*id);
    return out;
  }

  void ExpectEverythingFreed() {
    EXPECT_TRUE(common::WaitFor([&] { return loop_->Idle(); }));
    EXPECT_EQ(decode_model_->sequences().num_free_pages(), 128);
    EXPECT_EQ(decode_model_->sequences().num_free_slots(), 8);
    EXPECT_EQ(transport_.pending(), 0);
  }

  common::FakeClock clock_;
  std::unique_ptr<engine::ModelWeights> weights_;
  int64_t vocab_ = 0;
  std::unique_ptr<engine::Model> prefill_model_, decode_model_, reference_;
  transport::InProcessTransport transport_;
  std::unique_ptr<EnginePrefill> prefill_;
  std::unique_ptr<cachestore::CacheStore> store_;
  std::unique_ptr<cachestore::InProcessCacheClient> cache_;
  std::unique_ptr<DecodeLoop> loop_;
};

}  // namespace hybridserve::decode::test

#endif  // HYBRIDSERVE_DECODE_DECODE_LOOP_TEST_FIXTURE_H_
