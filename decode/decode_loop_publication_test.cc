// The decode loop's turn-end publication: the state visible in the cache when
// the request completes, the pages it adds past prefill's, waits for
// prefill's late pages that hold up no other publication, and a cache that
// is late, hung or stalled, which never stalls the batch.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/client/cache_plan.h"
#include "cachestore/client/fault_injecting_cache_client.h"
#include "common/clock.h"
#include "common/wait_for.h"
#include "decode/decode_loop.h"
#include "decode/decode_loop_test_fixture.h"
#include "engine/model_flops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hybridserve::decode::test {
namespace {

using ::testing::ElementsAreArray;

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
  // The turn end's puts registered the model's cost with the tenant's namespace.
  const cachestore::ClientNamespace ns{weights_->fingerprint().ToHex(), "", "", 16};
  EXPECT_EQ(store_->ModelCostOf(ns.Key()), engine::ModelPrefillCost(weights_->config()));
  EXPECT_GT(engine::ModelPrefillCost(weights_->config()).flops_per_token, 0);
  ExpectEverythingFreed();
}

// When prefill publishes the prompt (PrefillOutcome), the turn-end publication
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

// A cache in front of the real one that records the placement of every put.
class PlacementRecordingCache : public ForwardingCache {
 public:
  using ForwardingCache::ForwardingCache;
  absl::StatusOr<cachestore::PutResult> Put(const cachestore::ClientNamespace& ns, const cachestore::ClientPut& put,
                                            absl::string_view bytes) override {
    {
      absl::MutexLock lock(&mu_);
      placements_.push_back(ns.placement);
    }
    return inner_.Put(ns, put, bytes);
  }
  std::vector<std::optional<common::Hash128>> placements() {
    absl::MutexLock lock(&mu_);
    return placements_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::optional<common::Hash128>> placements_ ABSL_GUARDED_BY(mu_);
};

// A prompt shorter than a page whose reply completes the first page: the
// turn end is placed by the fed tokens' first page (the chain the next turn
// looks up over shards), not by the prompt's (N).
TEST_F(DecodeLoopTest, TheTurnEndIsPlacedByTheFedTokensFirstPage) {
  const std::vector<TokenId> prompt = Tokens(10, vocab_, 12);
  PlacementRecordingCache recording(*cache_);
  StartLoop({}, &recording);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("t", prompt, 9), &c).ok());
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(c.completion().usage.session.published);
  std::vector<TokenId> fed = prompt;
  const std::vector<TokenId> tokens = c.tokens();
  fed.insert(fed.end(), tokens.begin(), tokens.end() - 1);
  ASSERT_EQ(fed.size(), 18u);
  cachestore::ClientNamespace ns;
  ns.model_fingerprint = weights_->fingerprint().ToHex();
  ns.page_size = 16;
  const common::Hash128 first_page = cachestore::PageKey(ns.Key(), absl::MakeConstSpan(fed).first(16));
  const std::vector<std::optional<common::Hash128>> placements = recording.placements();
  ASSERT_EQ(placements.size(), 2u);  // page 0 and the state at 18
  for (const std::optional<common::Hash128>& p : placements) EXPECT_EQ(p, first_page);
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
// a call, so a hung cachestore costs one timeout, not one per request. Once
// the backoff has passed and the cache answers again, the next turn end
// reaches it and is published.
TEST_F(DecodeLoopTest, PublicationsSkipACacheThatJustTimedOutThenReachItAgain) {
  cachestore::FaultInjectingCacheClient faults(*cache_);
  faults.FailNext(cachestore::CacheClientMethod::kLookup, 1000, absl::DeadlineExceededError("cachestore hung"));
  faults.FailNext(cachestore::CacheClientMethod::kPut, 1000, absl::DeadlineExceededError("cachestore hung"));
  common::FakeClock clock;
  DecodeLoopOptions options;
  options.cache_backoff = std::make_shared<cachestore::CacheBackoff>(absl::Milliseconds(200), clock);
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
  // The cache answers again, and the backoff passes: the next turn end is published.
  faults.Clear();
  clock.Advance(absl::Milliseconds(200));
  Collector after;
  ASSERT_TRUE(loop_->Submit(Request("after", Tokens(40, vocab_, 30), 5), &after).ok());
  ASSERT_TRUE(after.Wait());
  EXPECT_TRUE(after.completion().publication.failure.empty()) << after.completion().publication.failure;
  EXPECT_TRUE(after.completion().usage.session.published);
  EXPECT_GT(faults.calls(cachestore::CacheClientMethod::kPut), 0);
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
}  // namespace hybridserve::decode::test
