// The decode loop with a second engine playing prefill over the in-process
// data plane: tokens equal to a single-engine run whatever the batch, stop
// conditions, admission limits, aborts, bad input, and the turn-end state
// visible in the cache when the request completes.

#include "decode/decode_loop.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cachestore/cache_plan.h"
#include "cachestore/cache_store.h"
#include "cachestore/fault_injecting_cache_client.h"
#include "cachestore/in_process_cache_client.h"
#include "common/clock.h"
#include "common/wait_for.h"
#include "engine/model.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/engine_import.h"
#include "transport/fake_communicator.h"
#include "transport/in_process_transport.h"
#include "transport/nccl_transport.h"
#include "transport/routing_sender.h"

namespace hybridserve::decode {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Runfile(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return relative;
  return absl::StrCat(srcdir, "/", workspace, "/", relative);
}

std::vector<TokenId> Tokens(int64_t n, int64_t vocab, int64_t seed) {
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
    absl::MutexLock lock(&mu_);
    completion_ = completion;
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
class EnginePrefill : public PrefillClient {
 public:
  EnginePrefill(engine::Model& model, const common::Hash128& fingerprint, transport::StateSender& sender)
      : model_(model), fingerprint_(fingerprint), sender_(sender) {}

  absl::StatusOr<PrefillReply> Prefill(const PrefillCall& call) override {
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
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
    auto id = model_.NewSequence();
    if (!id.ok()) return id.status();
    auto result = model_.Prefill(*id, call.prompt);
    absl::StatusOr<engine::Sampler> sampler = engine::Sampler::Create(call.sampling);
    absl::StatusOr<engine::SampledToken> first =
        result.ok() && sampler.ok() ? sampler->Sample(result->logits, 0) : absl::InternalError("prefill failed");
    absl::Status s = first.status();
    if (s.ok()) {
      auto source = transport::SequenceStateSource::Create(model_.sequences(), *id, call.ticket, fingerprint_, {},
                                                           first->token, first->logprob);
      s = source.ok() ? sender_.Send(call.ticket, *source) : source.status();
    }
    std::vector<std::string> pages;
    if (s.ok() && publishes_prompt()) {
      // What a prefill worker would publish after its answer: the prompt's
      // full pages. The test decides when they reach the cache.
      for (int64_t i = 0; s.ok() && i < static_cast<int64_t>(call.prompt.size()) / model_.page_size(); ++i) {
        absl::StatusOr<std::string> page = model_.ExportPage(*id, i);
        s = page.status();
        if (page.ok()) pages.push_back(*std::move(page));
      }
    }
    (void)model_.ReleaseSequence(*id);
    if (!s.ok()) return s;
    PrefillReply reply;
    reply.first = *first;
    reply.recomputed_tokens = 3;  // what a prefill worker reported, passed through
    if (publishes_prompt()) {
      reply.prefill_publishes_prompt = true;
      absl::MutexLock lock(&mu_);
      prompt_pages_[call.request_id] = std::move(pages);
    }
    return reply;
  }

  // Claims the prompt's pages as its to publish (PrefillReply) and keeps
  // their bytes for prompt_pages(), without putting them.
  void SetPublishesPrompt() {
    absl::MutexLock lock(&mu_);
    publishes_prompt_ = true;
  }
  bool publishes_prompt() {
    absl::MutexLock lock(&mu_);
    return publishes_prompt_;
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
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool ignore_cancel_ ABSL_GUARDED_BY(mu_) = false;
  bool publishes_prompt_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::vector<std::string>> prompt_pages_ ABSL_GUARDED_BY(mu_);
  absl::Mutex engine_mu_;  // the engine is not thread-safe
};

// A cache in front of the real one that records decode's puts and, the first
// time a put finds its parent missing, runs `catch_up` (prefill's late
// publication of the prompt) before answering.
class LatePrefillCache : public cachestore::CacheClient {
 public:
  LatePrefillCache(cachestore::CacheClient& inner, std::function<void()> catch_up)
      : inner_(inner), catch_up_(std::move(catch_up)) {}

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
  absl::Status GetInto(uint64_t lease_id, const common::Hash128& key, std::string* out) override {
    return inner_.GetInto(lease_id, key, out);
  }
  absl::Status Release(uint64_t lease_id) override { return inner_.Release(lease_id); }
  absl::StatusOr<cachestore::IndexStats> Stats() override { return inner_.Stats(); }

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
  cachestore::CacheClient& inner_;
  std::function<void()> catch_up_;
  absl::Mutex mu_;
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int missing_parent_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<TokenId>> page_puts_ ABSL_GUARDED_BY(mu_);
};

// A cache whose lookups block while held (a cachestore that stopped
// answering), in front of the real one.
class StalledLookupCache : public cachestore::CacheClient {
 public:
  explicit StalledLookupCache(cachestore::CacheClient& inner) : inner_(inner) {}
  absl::StatusOr<cachestore::LookupResult> Lookup(const cachestore::ClientNamespace& ns,
                                                  absl::Span<const TokenId> tokens,
                                                  cachestore::LookupMode mode) override {
    {
      absl::MutexLock lock(&mu_);
      ++blocked_;
      mu_.Await(absl::Condition(
          +[](bool* held) { return !*held; }, &held_));
      --blocked_;
    }
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

  void Hold(bool held) {
    absl::MutexLock lock(&mu_);
    held_ = held;
  }
  int blocked() {
    absl::MutexLock lock(&mu_);
    return blocked_;
  }

 private:
  cachestore::CacheClient& inner_;
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
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
    auto id = reference_->NewSequence();
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
    (void)reference_->ReleaseSequence(*id);
    return out;
  }

  void ExpectEverythingFreed() {
    EXPECT_TRUE(common::WaitFor([&] { return loop_->Idle(); }));
    EXPECT_EQ(decode_model_->num_free_pages(), 128);
    EXPECT_EQ(decode_model_->num_free_sequences(), 8);
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

TEST_F(DecodeLoopTest, StreamsTheTokensOfASingleEngineRunAndEndsAtMaxTokens) {
  StartLoop();
  const std::vector<TokenId> prompt = Tokens(37, vocab_, 1);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("a", prompt, 8), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_THAT(c.tokens(), ElementsAreArray(Alone(prompt, 8)));
  const Completion done = c.completion();
  EXPECT_EQ(done.reason, FinishReason::kLength);
  EXPECT_EQ(done.usage.prompt_tokens, 37);
  EXPECT_EQ(done.usage.completion_tokens, 8);
  EXPECT_EQ(done.usage.recomputed_tokens, 3);
  ExpectEverythingFreed();
}

// The NCCL data plane's protocol (over the in-memory fake communicator): the
// decode worker's receiver puts its channel on each ticket, the prefill side
// routes the ticket by its kind, and the request streams the single-engine
// tokens with everything freed after. (NCCL itself needs GPUs:
// //transport:nccl_communicator_test.)
TEST_F(DecodeLoopTest, TicketsOverTheNcclPlaneStreamTheSingleEngineTokens) {
  transport::FakeCommunicatorFactory factory;
  transport::NcclReceiverOptions ro;
  ro.default_peer = "prefill-0";
  auto receiver = transport::NcclStateReceiver::Create(factory, ro);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  transport::NcclStateSender nccl(factory);
  transport::RoutingStateSender router;
  router.Route(transport::TransportKind::kNccl, &nccl);
  EnginePrefill prefill(*prefill_model_, weights_->fingerprint(), router);
  DecodeLoopOptions options;
  options.endpoint = "decode-0";
  auto loop = DecodeLoop::Create(*decode_model_, weights_->fingerprint(), prefill, **receiver, cache_.get(), options);
  ASSERT_TRUE(loop.ok()) << loop.status();
  const std::vector<TokenId> prompt = Tokens(45, vocab_, 5);
  for (const std::string id : {"a", "b"}) {  // the second reuses the channel
    Collector c;
    ASSERT_TRUE((*loop)->Submit(Request(id, prompt, 6), &c).ok());
    ASSERT_TRUE(c.Wait());
    EXPECT_EQ(c.completion().reason, FinishReason::kLength) << c.completion().error;
    EXPECT_THAT(c.tokens(), ElementsAreArray(Alone(prompt, 6)));
  }
  EXPECT_EQ(nccl.channels(), 1);
  EXPECT_TRUE(common::WaitFor([&] { return (*loop)->Idle(); }));
  EXPECT_TRUE((*loop)->Idle());
  EXPECT_EQ((*receiver)->pending(), 0);
  EXPECT_EQ(decode_model_->num_free_pages(), 128);
}

TEST_F(DecodeLoopTest, StopIdsStopSequencesAndEosEndWithStop) {
  DecodeLoopOptions o;
  const std::vector<TokenId> prompt = Tokens(20, vocab_, 2);
  const std::vector<TokenId> alone = Alone(prompt, 10);
  // The loop stops at the first occurrence: find tokens first seen at 2, 3, 4.
  o.eos_token_ids = {alone[4]};
  StartLoop(o);
  auto first_index = [&](TokenId t) { return std::find(alone.begin(), alone.end(), t) - alone.begin(); };

  Collector by_id;
  GenerateRequest r = Request("id", prompt, 10);
  r.stop.stop_token_ids = {alone[2]};
  ASSERT_TRUE(loop_->Submit(r, &by_id).ok());
  ASSERT_TRUE(by_id.Wait());
  EXPECT_EQ(by_id.completion().reason, FinishReason::kStop);
  EXPECT_EQ(by_id.completion().stop_token_id, alone[2]);
  EXPECT_EQ(static_cast<int64_t>(by_id.tokens().size()),
            std::min<int64_t>(first_index(alone[2]), first_index(alone[4])) + 1);

  Collector by_sequence;
  r = Request("seq", prompt, 10);
  r.stop.ignore_eos = true;
  r.stop.stop_sequences = {{alone[5], alone[6]}};
  ASSERT_TRUE(loop_->Submit(r, &by_sequence).ok());
  ASSERT_TRUE(by_sequence.Wait());
  EXPECT_EQ(by_sequence.completion().reason, FinishReason::kStop);
  const std::vector<TokenId> got = by_sequence.tokens();
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[got.size() - 2], alone[5]);
  EXPECT_EQ(got.back(), alone[6]);

  Collector by_eos;
  ASSERT_TRUE(loop_->Submit(Request("eos", prompt, 10), &by_eos).ok());
  ASSERT_TRUE(by_eos.Wait());
  EXPECT_EQ(by_eos.completion().reason, FinishReason::kStop);
  EXPECT_EQ(by_eos.tokens().back(), alone[4]);
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopTest, ConcurrentRequestsEachGetTheirSingleRunTokens) {
  DecodeLoopOptions o;
  o.max_batch = 3;
  o.max_waiting = 8;
  StartLoop(o);
  std::vector<std::unique_ptr<Collector>> sinks;
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 7; ++i) {
    prompts.push_back(Tokens(5 + 13 * i, vocab_, 10 + i));
    sinks.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(loop_->Submit(Request(absl::StrCat("r", i), prompts.back(), 4 + i), sinks.back().get()).ok());
  }
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(sinks[i]->Wait());
    EXPECT_THAT(sinks[i]->tokens(), ElementsAreArray(Alone(prompts[i], 4 + i))) << "request " << i;
  }
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopTest, BeyondTheWaitQueueRequestsAreRefusedAtOnce) {
  DecodeLoopOptions o;
  o.max_batch = 1;
  o.max_waiting = 1;
  StartLoop(o);
  prefill_->Hold();
  Collector a, b, c;
  ASSERT_TRUE(loop_->Submit(Request("a", Tokens(10, vocab_, 3), 3), &a).ok());
  ASSERT_TRUE(loop_->Submit(Request("b", Tokens(10, vocab_, 4), 3), &b).ok());
  absl::Status third = loop_->Submit(Request("c", Tokens(10, vocab_, 5), 3), &c);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(loop_->Submit(Request("a", Tokens(10, vocab_, 3), 3), &c).code(), absl::StatusCode::kInvalidArgument);
  GenerateRequest huge = Request("huge", Tokens(10, vocab_, 3), 128 * 16);
  EXPECT_EQ(loop_->Submit(huge, &c).code(), absl::StatusCode::kResourceExhausted);  // can never fit
  prefill_->Release();
  ASSERT_TRUE(a.Wait() && b.Wait());
  EXPECT_EQ(a.completion().reason, FinishReason::kLength);
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopTest, AbortAndDeadlinesEndRequestsAndFreeEverything) {
  StartLoop();
  prefill_->Hold();
  Collector prefilling;
  ASSERT_TRUE(loop_->Submit(Request("p", Tokens(30, vocab_, 6), 50), &prefilling).ok());
  ASSERT_TRUE(common::WaitFor([&] { return prefill_->calls() == 1; }))
      << "the request never reached prefill: the abort would prove nothing";
  EXPECT_TRUE(loop_->Abort("p"));
  ASSERT_TRUE(prefilling.Wait());
  EXPECT_EQ(prefilling.completion().reason, FinishReason::kAborted);
  EXPECT_FALSE(loop_->Abort("p"));
  // Its prefill call was cancelled, and returned although still held.
  EXPECT_TRUE(common::WaitFor([&] { return prefill_->cancelled() == 1; }));
  prefill_->Release();

  Collector decoding;
  decoding.on_complete_ = [](const Completion&) {};
  ASSERT_TRUE(loop_->Submit(Request("d", Tokens(30, vocab_, 7), 1500), &decoding).ok());
  ASSERT_TRUE(common::WaitFor([&] { return decoding.tokens().size() >= 3; }))
      << "never decoding: the abort would prove nothing";
  EXPECT_TRUE(loop_->Abort("d"));
  ASSERT_TRUE(decoding.Wait());
  EXPECT_EQ(decoding.completion().reason, FinishReason::kAborted);
  EXPECT_LT(decoding.tokens().size(), 1500u);

  // The deadline strikes mid-decode whatever the machine's speed: the first
  // token holds the loop thread until the deadline has passed, so the tiny
  // model cannot finish its 1500 tokens first.
  Collector late;
  GenerateRequest r = Request("late", Tokens(30, vocab_, 8), 1500);
  r.deadline = absl::Now() + absl::Milliseconds(100);
  late.on_token_ = [deadline = r.deadline](const engine::SampledToken&) {
    while (absl::Now() <= deadline) absl::SleepFor(absl::Milliseconds(5));
  };
  ASSERT_TRUE(loop_->Submit(r, &late).ok());
  ASSERT_TRUE(late.Wait());
  EXPECT_EQ(late.completion().reason, FinishReason::kAborted);
  EXPECT_EQ(late.completion().error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(late.tokens().size(), 1500u);
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopTest, APrefillFailureEndsTheRequestWithItsStatus) {
  StartLoop();
  prefill_->FailWith(absl::UnavailableError("prefill worker gone"));
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("f", Tokens(30, vocab_, 9), 5), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.completion().reason, FinishReason::kError);
  EXPECT_THAT(c.completion().error.message(), HasSubstr("prefill worker gone"));
  EXPECT_TRUE(c.tokens().empty());
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopTest, BadRequestsNameTheField) {
  StartLoop();
  Collector c;
  auto check = [&](GenerateRequest r, const std::string& field) {
    absl::Status s = loop_->Submit(std::move(r), &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  const std::vector<TokenId> ok = Tokens(5, vocab_, 1);
  check(Request("", ok, 3), "request_id");
  check(Request(std::string(257, 'x'), ok, 3), "request_id");
  check(Request("x", {}, 3), "prompt_token_ids");
  check(Request("x", {1, static_cast<TokenId>(vocab_)}, 3), "prompt_token_ids[1]");
  check(Request("x", ok, 0), "max_tokens");
  GenerateRequest r = Request("x", ok, 3);
  r.stop.stop_token_ids = {-1};
  check(r, "stop_token_ids[0]");
  r = Request("x", ok, 3);
  r.stop.stop_sequences = {{1}, {}};
  check(r, "stop_sequences[1]");
  r = Request("x", ok, 3);
  r.sampling.temperature = -1.0f;
  check(r, "temperature");
  r = Request("x", ok, 3);
  r.sampling.top_p = std::numeric_limits<float>::quiet_NaN();
  check(r, "top_p");
  EXPECT_TRUE(loop_->Idle());
  EXPECT_EQ(prefill_->calls(), 0);
}

TEST_F(DecodeLoopTest, TheTurnEndStateIsInTheCacheWhenTheRequestCompletes) {
  StartLoop();
  const std::vector<TokenId> prompt = Tokens(40, vocab_, 12);
  Collector c;
  int64_t resume_at_completion = -1;
  c.on_complete_ = [&](const Completion& done) {
    // The client's next turn, sent the instant this one ends.
    std::vector<TokenId> next = prompt;
    std::vector<TokenId> tokens = c.tokens();
    next.insert(next.end(), tokens.begin(), tokens.end());
    next.push_back(1);
    cachestore::ClientNamespace ns;
    ns.model_fingerprint = weights_->fingerprint().ToHex();
    ns.page_size = 16;
    auto lookup = cache_->Lookup(ns, next, cachestore::LookupMode::kProbeOnly);
    resume_at_completion = lookup.ok() ? lookup->resume_position : -2;
  };
  ASSERT_TRUE(loop_->Submit(Request("t", prompt, 9), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(resume_at_completion, 40 + 9 - 1);  // every token fed to the model
  ExpectEverythingFreed();
}

// When prefill publishes the prompt (PrefillReply), the turn-end publication
// puts only the pages past the prompt, without a probe, and waits for
// prefill's pages when they are late (here: not in the cache until decode's
// first put has found its parent missing).
TEST_F(DecodeLoopTest, TurnEndPublicationAddsOnlyThePagesPastThePromptAndWaitsForPrefills) {
  prefill_->SetPublishesPrompt();
  const std::vector<TokenId> prompt = Tokens(40, vocab_, 12);  // two full pages of 16
  cachestore::ClientNamespace ns;
  ns.model_fingerprint = weights_->fingerprint().ToHex();
  ns.page_size = 16;
  LatePrefillCache late(*cache_, [&] {
    const cachestore::CachePlan plan(ns, prompt);
    std::vector<std::string> pages = prefill_->prompt_pages("t");
    ASSERT_EQ(pages.size(), 2u);
    for (int64_t i = 0; i < 2; ++i) ASSERT_TRUE(cache_->Put(ns, plan.PagePut(i), pages[i]).ok());
  });
  StartLoop({}, &late);
  Collector c;
  int64_t resume_at_completion = -1;
  c.on_complete_ = [&](const Completion&) {
    std::vector<TokenId> next = prompt;
    std::vector<TokenId> tokens = c.tokens();
    next.insert(next.end(), tokens.begin(), tokens.end());
    next.push_back(1);
    auto lookup = cache_->Lookup(ns, next, cachestore::LookupMode::kProbeOnly);
    resume_at_completion = lookup.ok() ? lookup->resume_position : -2;
  };
  ASSERT_TRUE(loop_->Submit(Request("t", prompt, 9), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_TRUE(c.completion().usage.session.published);
  EXPECT_EQ(resume_at_completion, 40 + 9 - 1);
  EXPECT_EQ(late.lookups(), 0);
  EXPECT_GE(late.missing_parent(), 1);
  // Decode's only page: tokens 32..47 (the prompt's tail and the first 8
  // generated tokens fed to the model).
  std::vector<TokenId> fed = prompt;
  const std::vector<TokenId> tokens = c.tokens();
  fed.insert(fed.end(), tokens.begin(), tokens.end() - 1);
  ASSERT_EQ(late.page_puts().size(), 1u);
  EXPECT_THAT(late.page_puts()[0], ElementsAreArray(fed.begin() + 32, fed.begin() + 48));
  ExpectEverythingFreed();
}

// Prefill publishes the prompt but never does (its cache failed): decode waits
// publish_parent_wait, then completes without the turn-end state.
TEST_F(DecodeLoopTest, TurnEndPublicationGivesUpWhenPrefillsPagesNeverCome) {
  prefill_->SetPublishesPrompt();
  LatePrefillCache never(*cache_, [] {});
  DecodeLoopOptions options;
  options.publish_parent_wait = absl::Milliseconds(50);
  StartLoop(options, &never);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("t", Tokens(40, vocab_, 13), 9), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.completion().reason, FinishReason::kLength);
  EXPECT_FALSE(c.completion().usage.session.published);
  EXPECT_GE(never.missing_parent(), 2);  // it retried
  ExpectEverythingFreed();
}

// A request that ends while its prefill call runs cancels the call; a call
// that does not stop at once (a worker slow to notice) keeps its place in the
// batch until it returns: prefill never holds more of this worker's calls
// than max_batch, and the next request waits in decode instead.
TEST_F(DecodeLoopTest, AnEndedRequestsPrefillCallKeepsItsBatchPlaceUntilItReturns) {
  DecodeLoopOptions options;
  options.max_batch = 1;
  StartLoop(options);
  prefill_->IgnoreCancellation();
  prefill_->Hold();
  Collector first;
  ASSERT_TRUE(loop_->Submit(Request("first", Tokens(30, vocab_, 14), 5), &first).ok());
  ASSERT_TRUE(common::WaitFor([&] { return prefill_->calls() == 1; }));
  ASSERT_TRUE(loop_->Abort("first"));
  ASSERT_TRUE(first.Wait());
  EXPECT_EQ(first.completion().reason, FinishReason::kAborted);
  Collector second;
  ASSERT_TRUE(loop_->Submit(Request("second", Tokens(30, vocab_, 15), 5), &second).ok());
  // The orphaned call holds the only place: the second request waits.
  ASSERT_TRUE(common::WaitFor([&] { return loop_->counts().waiting == 1; }));
  DecodeLoop::Counts c = loop_->counts();
  EXPECT_EQ(c.orphaned_calls, 1);
  EXPECT_EQ(prefill_->calls(), 1);
  EXPECT_FALSE(loop_->Idle());
  prefill_->Release();
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(second.completion().reason, FinishReason::kLength);
  EXPECT_EQ(second.tokens(), Alone(Tokens(30, vocab_, 15), 5));
  EXPECT_EQ(prefill_->calls(), 2);
  EXPECT_EQ(loop_->counts().orphaned_calls, 0);
  ExpectEverythingFreed();
}

// A turn end waiting for its parent page (prefill's late publication) holds
// up no other publication: a second request's turn end is published, and its
// final message sent, while the first still waits; the first then completes
// once its parent arrives.
TEST_F(DecodeLoopTest, ATurnEndWaitingForItsParentHoldsUpNoOtherPublication) {
  prefill_->SetPublishesPrompt();
  LatePrefillCache late(*cache_, [] {});
  DecodeLoopOptions options;
  options.publish_parent_wait = absl::Seconds(60);
  StartLoop(options, &late);
  const std::vector<TokenId> waiting_prompt = Tokens(40, vocab_, 16);  // two full pages, not in the cache
  Collector waiting;
  ASSERT_TRUE(loop_->Submit(Request("waiting", waiting_prompt, 9), &waiting).ok());
  ASSERT_TRUE(common::WaitFor([&] { return late.missing_parent() >= 1; }))
      << "the turn end never found its parent missing";
  Collector other;
  ASSERT_TRUE(loop_->Submit(Request("other", Tokens(10, vocab_, 17), 9), &other).ok());  // no full prompt page
  ASSERT_TRUE(other.Wait());
  EXPECT_TRUE(other.completion().usage.session.published);
  EXPECT_TRUE(other.completion().publication.failure.empty());
  EXPECT_FALSE(waiting.done()) << "the waiting turn end gave up or was done first";
  // Prefill's pages arrive: the waiting one is published.
  cachestore::ClientNamespace ns;
  ns.model_fingerprint = weights_->fingerprint().ToHex();
  ns.page_size = 16;
  const cachestore::CachePlan plan(ns, waiting_prompt);
  const std::vector<std::string> pages = prefill_->prompt_pages("waiting");
  ASSERT_EQ(pages.size(), 2u);
  for (int64_t i = 0; i < 2; ++i) ASSERT_TRUE(cache_->Put(ns, plan.PagePut(i), pages[i]).ok());
  ASSERT_TRUE(waiting.Wait());
  EXPECT_TRUE(waiting.completion().usage.session.published);
  EXPECT_FALSE(waiting.completion().publication.parent_wait_expired);
  EXPECT_GT(waiting.completion().publication.wait, absl::ZeroDuration());
  ExpectEverythingFreed();
}

// Publication failures are reported in the completion, by reason.
TEST_F(DecodeLoopTest, APublicationThatWaitedOutItsParentSaysSo) {
  prefill_->SetPublishesPrompt();
  LatePrefillCache never(*cache_, [] {});
  DecodeLoopOptions options;
  options.publish_parent_wait = absl::Milliseconds(50);
  StartLoop(options, &never);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("t", Tokens(40, vocab_, 18), 9), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_TRUE(c.completion().publication.attempted);
  EXPECT_EQ(c.completion().publication.failure, "failed_precondition");
  EXPECT_TRUE(c.completion().publication.parent_wait_expired);
  ExpectEverythingFreed();
}

// A cache that stopped answering in time (each call ends DEADLINE_EXCEEDED):
// the first publication finds out, the ones after it skip the cache without
// a call, so a hung cachestore costs one timeout, not one per request.
TEST_F(DecodeLoopTest, PublicationsSkipACacheThatJustTimedOut) {
  cachestore::FaultInjectingCacheClient faults(*cache_);
  faults.FailNext(cachestore::CacheClientMethod::kLookup, 1000, absl::DeadlineExceededError("cachestore hung"));
  faults.FailNext(cachestore::CacheClientMethod::kPut, 1000, absl::DeadlineExceededError("cachestore hung"));
  DecodeLoopOptions options;
  options.cache_failure_backoff = absl::Hours(1);
  StartLoop(options, &faults);
  for (int i = 0; i < 4; ++i) {
    Collector c;
    ASSERT_TRUE(loop_->Submit(Request(absl::StrCat("r", i), Tokens(40, vocab_, 22 + i), 5), &c).ok());
    ASSERT_TRUE(c.Wait());
    EXPECT_EQ(c.completion().reason, FinishReason::kLength);
    EXPECT_FALSE(c.completion().usage.session.published);
    EXPECT_EQ(c.completion().publication.failure, i == 0 ? "deadline_exceeded" : "unavailable") << i;
  }
  EXPECT_EQ(faults.calls(cachestore::CacheClientMethod::kLookup) + faults.calls(cachestore::CacheClientMethod::kPut),
            1);
  ExpectEverythingFreed();
}

// When prefill does not publish the prompt, the turn end asks the cache
// which pages it lacks, on the publisher thread: a cache that stops answering
// delays final messages, never the batch (another request decodes all its
// tokens meanwhile), and once it answers both turn ends are published.
TEST_F(DecodeLoopTest, AStalledCacheNeverStallsTheBatch) {
  StalledLookupCache stalled(*cache_);
  stalled.Hold(true);
  StartLoop({}, &stalled);
  Collector first;
  ASSERT_TRUE(loop_->Submit(Request("first", Tokens(40, vocab_, 19), 5), &first).ok());
  ASSERT_TRUE(common::WaitFor([&] { return stalled.blocked() == 1; })) << "the turn end never asked the cache";
  Collector second;
  ASSERT_TRUE(loop_->Submit(Request("second", Tokens(30, vocab_, 20), 40), &second).ok());
  ASSERT_TRUE(common::WaitFor([&] { return second.tokens().size() == 40; })) << "the batch stalled";
  EXPECT_EQ(second.tokens(), Alone(Tokens(30, vocab_, 20), 40));
  EXPECT_FALSE(first.done());
  stalled.Hold(false);
  ASSERT_TRUE(first.Wait() && second.Wait());
  EXPECT_TRUE(first.completion().usage.session.published);
  EXPECT_TRUE(second.completion().usage.session.published);
  ExpectEverythingFreed();
}

}  // namespace
}  // namespace hybridserve::decode
