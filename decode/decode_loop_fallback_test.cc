// Fallback prefill (DecodeLoopOptions::fallback_prefill_max_tokens): a
// request whose prefill call failed (no worker answered, or the worker died
// during the call) is prefilled in the decode engine, once, with the bits of
// the prefill pool's path, with or without a cache, first turn or
// continuation; the next request goes to the pool again. Off, or for a
// prompt over the limit, the pool's error ends the request as before.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "decode/decode_loop.h"
#include "decode/decode_loop_test_fixture.h"
#include "gtest/gtest.h"
#include "prefill/in_process_prefill_client.h"
#include "prefill/prefill_worker.h"

namespace hybridserve::decode::test {
namespace {

// A prefill pool in front of a real one: healthy, with no worker answering
// (UNAVAILABLE without a call), or with a worker that does the work, pushes
// the state and dies before it answers (the call fails mid-way).
class FlakyPool : public prefill::PrefillClient {
 public:
  enum class Mode { kHealthy, kNoWorker, kDiesMidCall };
  explicit FlakyPool(prefill::PrefillClient& inner) : inner_(inner) {}

  absl::StatusOr<prefill::PrefillOutcome> Prefill(const prefill::PrefillRequest& call) override {
    const Mode mode = this->mode();
    {
      absl::MutexLock lock(&mu_);
      skips_.push_back(call.skip_unavailable_wait);
    }
    if (mode == Mode::kNoWorker) {
      return absl::UnavailableError("no prefill worker is known (none of the targets resolved)");
    }
    absl::MutexLock lock(&mu_);
    ++calls_;
    absl::StatusOr<prefill::PrefillOutcome> outcome = inner_.Prefill(call);
    if (mode == Mode::kDiesMidCall) return absl::InternalError("prefill worker 10.0.0.1:50051: Socket closed");
    return outcome;
  }
  void Set(Mode mode) {
    absl::MutexLock lock(&mu_);
    mode_ = mode;
  }
  Mode mode() {
    absl::MutexLock lock(&mu_);
    return mode_;
  }
  // Each call's skip_unavailable_wait, in order.
  std::vector<bool> skips() {
    absl::MutexLock lock(&mu_);
    return skips_;
  }
  // Calls that reached the real pool.
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  prefill::PrefillClient& inner_;
  absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kHealthy;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> skips_ ABSL_GUARDED_BY(mu_);
};

// One request's tokens, logprobs and completion.
struct Answer {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  Completion completion;
};

class DecodeLoopFallbackTest : public DecodeLoopTest {
 protected:
  void TearDown() override {
    loop_.reset();  // before the workers it calls
    local_.reset();
    pool_.reset();
    remote_client_.reset();
    remote_.reset();
  }

  // A prefill pool of one real worker on its own engine over the in-process
  // plane (behind a FlakyPool), a worker on the decode engine for the
  // fallback, and the loop over them; `with_cache`: a fresh cache for all,
  // else none. `local` wraps the decode engine's worker (the tests count or
  // fail its calls).
  void Start(int64_t fallback_max_tokens, bool with_cache,
             std::function<absl::StatusOr<prefill::KeptPrefill>(prefill::PrefillWorker&, const prefill::PrefillRequest&,
                                                                int64_t)>
                 local = nullptr) {
    TearDown();
    cachestore::CacheClient* cache = nullptr;
    if (with_cache) {
      auto store = cachestore::CacheStore::Create(cachestore::CacheIndexOptions(), clock_);
      ASSERT_TRUE(store.ok());
      cache_.reset();
      store_ = *std::move(store);
      cache_ = std::make_unique<cachestore::InProcessCacheClient>(*store_);
      cache = cache_.get();
    }
    prefill::PrefillWorkerOptions wo;  // puts inline: each turn's publication is done when it answers
    remote_ = std::make_unique<prefill::PrefillWorker>(*prefill_model_, weights_->fingerprint(), cache, transport_, wo);
    remote_client_ = std::make_unique<prefill::InProcessPrefillClient>(*remote_);
    pool_ = std::make_unique<FlakyPool>(*remote_client_);
    local_ = std::make_unique<prefill::PrefillWorker>(*decode_model_, weights_->fingerprint(), cache, wo);
    if (!local) {
      local = [](prefill::PrefillWorker& w, const prefill::PrefillRequest& r, int64_t positions) {
        return w.PrefillAndKeep(r, positions);
      };
    }
    DecodeLoopOptions o;
    o.fallback_prefill_max_tokens = fallback_max_tokens;
    o.local_prefill_max_tokens = 0;  // continuations too go to the pool first
    auto loop = DecodeLoop::Create(
        *decode_model_, weights_->fingerprint(), *pool_, transport_, cache, o,
        [this, local](const prefill::PrefillRequest& r, int64_t positions) { return local(*local_, r, positions); });
    ASSERT_TRUE(loop.ok()) << loop.status();
    loop_ = *std::move(loop);
  }

  Answer Play(const std::string& id, const std::vector<TokenId>& prompt, int64_t max_tokens = 6) {
    Answer out;
    Collector c;
    c.on_token_ = [&](const engine::SampledToken& t) { out.logprobs.push_back(t.logprob); };
    GenerateRequest r = Request(id, prompt, max_tokens);
    r.sampling.logprobs = true;
    EXPECT_TRUE(loop_->Submit(r, &c).ok());
    EXPECT_TRUE(c.Wait());
    out.tokens = c.tokens();
    out.completion = c.completion();
    return out;
  }

  // Turn 2's prompt: turn 1's and its answer, and `added` new tokens.
  std::vector<TokenId> NextPrompt(const std::vector<TokenId>& prompt, const Answer& turn, int64_t added) const {
    std::vector<TokenId> next = prompt;
    next.insert(next.end(), turn.tokens.begin(), turn.tokens.end());
    const std::vector<TokenId> more = Tokens(added, vocab_, 4);
    next.insert(next.end(), more.begin(), more.end());
    return next;
  }

  std::unique_ptr<prefill::PrefillWorker> remote_, local_;
  std::unique_ptr<prefill::InProcessPrefillClient> remote_client_;
  std::unique_ptr<FlakyPool> pool_;
};

// With no prefill worker answering, a first turn and its continuation are
// prefilled here, with and without a cache, and answer every token and
// logprob of the pool's path bit for bit.
TEST_F(DecodeLoopFallbackTest, NoWorkerAnswersThenPrefillsHereWithThePoolsBits) {
  const std::vector<TokenId> first = Tokens(40, vocab_, 3);
  for (const bool with_cache : {false, true}) {
    SCOPED_TRACE(with_cache ? "with a cache" : "without a cache");
    Start(/*fallback_max_tokens=*/8192, with_cache);
    const Answer pool1 = Play("turn-1", first, 9);
    const std::vector<TokenId> second = NextPrompt(first, pool1, 20);
    const Answer pool2 = Play("turn-2", second);
    ASSERT_EQ(pool_->calls(), 2);
    EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 0);

    Start(/*fallback_max_tokens=*/8192, with_cache);
    pool_->Set(FlakyPool::Mode::kNoWorker);
    const Answer here1 = Play("turn-1", first, 9);
    const Answer here2 = Play("turn-2", second);
    EXPECT_EQ(pool_->calls(), 0);
    const DecodeLoop::Counts c = loop_->counts();
    EXPECT_EQ(c.fallback_prefills_unavailable, 2);
    EXPECT_EQ(c.fallback_prefills_failed, 0);
    EXPECT_EQ(c.fallback_prefill_failures, 0);
    for (const auto& [here, pool] : {std::pair{here1, pool1}, std::pair{here2, pool2}}) {
      EXPECT_EQ(here.completion.reason, FinishReason::kLength) << here.completion.error;
      EXPECT_EQ(here.tokens, pool.tokens);
      EXPECT_EQ(here.logprobs, pool.logprobs);
      EXPECT_EQ(here.completion.usage.cached_tokens, pool.completion.usage.cached_tokens);
    }
    EXPECT_EQ(here1.tokens, Alone(first, 9));
    EXPECT_EQ(here2.tokens, Alone(second, 6));
    // With a cache, turn 2 resumed from turn 1's end (40 + 8 fed) here too.
    EXPECT_EQ(here2.completion.usage.cached_tokens, with_cache ? 48 : 0);
    ExpectEverythingFreed();
  }
}

// A worker that dies during the call (its state pushed, no answer): the
// request is prefilled here, once, not sent to the pool again; when the
// local prefill fails too, the request ends with an error naming both.
TEST_F(DecodeLoopFallbackTest, AWorkerDyingMidCallIsRetriedHereOnce) {
  int local_calls = 0;
  bool fail_local = false;
  Start(/*fallback_max_tokens=*/8192, /*with_cache=*/true,
        [&](prefill::PrefillWorker& w, const prefill::PrefillRequest& r, int64_t positions) {
          ++local_calls;
          return fail_local ? absl::StatusOr<prefill::KeptPrefill>(absl::ResourceExhaustedError("no room"))
                            : w.PrefillAndKeep(r, positions);
        });
  const std::vector<TokenId> prompt = Tokens(40, vocab_, 3);
  pool_->Set(FlakyPool::Mode::kDiesMidCall);
  const Answer a = Play("a", prompt, 9);
  EXPECT_EQ(a.completion.reason, FinishReason::kLength) << a.completion.error;
  EXPECT_EQ(a.tokens, Alone(prompt, 9));
  EXPECT_EQ(pool_->calls(), 1);
  EXPECT_EQ(local_calls, 1);
  EXPECT_EQ(loop_->counts().fallback_prefills_failed, 1);
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 0);
  ExpectEverythingFreed();

  fail_local = true;
  const Answer b = Play("b", Tokens(30, vocab_, 5), 4);
  EXPECT_EQ(b.completion.reason, FinishReason::kError);
  EXPECT_TRUE(b.tokens.empty());
  EXPECT_EQ(b.completion.error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(b.completion.error.message(), "Socket closed")) << b.completion.error;
  EXPECT_TRUE(absl::StrContains(b.completion.error.message(), "no room")) << b.completion.error;
  EXPECT_EQ(pool_->calls(), 2);
  EXPECT_EQ(local_calls, 2);
  EXPECT_EQ(loop_->counts().fallback_prefill_failures, 1);
  ExpectEverythingFreed();
}

// Once a worker answers again, requests go to the pool: no sticky fallback.
// While calls fail, the next ones still call the pool, but skip its wait for
// an unreachable worker (a prompt the fallback cannot take waits as before);
// the first call that succeeds ends that.
TEST_F(DecodeLoopFallbackTest, APoolBackTakesTheNextRequests) {
  Start(/*fallback_max_tokens=*/35, /*with_cache=*/false);
  pool_->Set(FlakyPool::Mode::kNoWorker);
  EXPECT_EQ(Play("a", Tokens(30, vocab_, 3)).completion.reason, FinishReason::kLength);
  EXPECT_EQ(Play("b", Tokens(30, vocab_, 5)).completion.reason, FinishReason::kLength);
  EXPECT_EQ(Play("too-long", Tokens(36, vocab_, 5)).completion.reason, FinishReason::kError);
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 2);
  pool_->Set(FlakyPool::Mode::kHealthy);
  const std::vector<TokenId> prompt = Tokens(30, vocab_, 4);
  const Answer c = Play("c", prompt);
  EXPECT_EQ(c.completion.reason, FinishReason::kLength) << c.completion.error;
  EXPECT_EQ(c.tokens, Alone(prompt, 6));
  const Answer d = Play("d", prompt);
  EXPECT_EQ(d.tokens, c.tokens);
  EXPECT_EQ(pool_->calls(), 2);
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 2);
  EXPECT_EQ(pool_->skips(), (std::vector<bool>{false, true, false, true, false}));
  ExpectEverythingFreed();
}

// Off: the pool's error ends the request, as without a fallback.
TEST_F(DecodeLoopFallbackTest, OffThePoolsErrorEndsTheRequest) {
  int local_calls = 0;
  Start(/*fallback_max_tokens=*/0, /*with_cache=*/false,
        [&](prefill::PrefillWorker& w, const prefill::PrefillRequest& r, int64_t positions) {
          ++local_calls;
          return w.PrefillAndKeep(r, positions);
        });
  pool_->Set(FlakyPool::Mode::kNoWorker);
  const Answer a = Play("a", Tokens(30, vocab_, 3));
  EXPECT_EQ(a.completion.reason, FinishReason::kError);
  EXPECT_EQ(a.completion.error, absl::UnavailableError("no prefill worker is known (none of the targets resolved)"));
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_EQ(local_calls, 0);
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 0);
  ExpectEverythingFreed();
}

// A prompt over the limit ends with the pool's error, its message naming
// the limit.
TEST_F(DecodeLoopFallbackTest, APromptOverTheLimitEndsWithThePoolsErrorNamingIt) {
  Start(/*fallback_max_tokens=*/39, /*with_cache=*/false);
  pool_->Set(FlakyPool::Mode::kNoWorker);
  const Answer a = Play("a", Tokens(40, vocab_, 3));
  EXPECT_EQ(a.completion.reason, FinishReason::kError);
  EXPECT_EQ(a.completion.error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.completion.error.message(),
            "no prefill worker is known (none of the targets resolved); not prefilled here instead: the prompt's 40 "
            "tokens exceed fallback_prefill_max_tokens (39)");
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 0);
  // At the limit: prefilled here.
  const std::vector<TokenId> prompt = Tokens(39, vocab_, 3);
  const Answer b = Play("b", prompt);
  EXPECT_EQ(b.completion.reason, FinishReason::kLength) << b.completion.error;
  EXPECT_EQ(b.tokens, Alone(prompt, 6));
  EXPECT_EQ(loop_->counts().fallback_prefills_unavailable, 1);
  ExpectEverythingFreed();
}

}  // namespace
}  // namespace hybridserve::decode::test
