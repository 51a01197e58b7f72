// Local prefill (DecodeLoopOptions::local_prefill_max_tokens): a request
// whose prompt the cache holds all but a few tokens of is prefilled in the
// decode engine by a prefill worker that keeps the sequence, with the bits
// of the prefill pool's path; a new prompt, a longer continuation, another
// request decoding (unless allowed) or a failure of the local prefill leave
// the request to the prefill pool.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "common/wait_for.h"
#include "decode/decode_loop.h"
#include "decode/decode_loop_test_fixture.h"
#include "gtest/gtest.h"
#include "prefill/in_process_prefill_client.h"
#include "prefill/prefill_worker.h"

namespace hybridserve::decode::test {
namespace {

// One turn's tokens, their logprobs and how its prefill resumed.
struct Turn {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  int64_t cached_tokens = 0;
};

class DecodeLoopLocalPrefillTest : public DecodeLoopTest {
 protected:
  void TearDown() override {
    loop_.reset();  // before the workers it calls
    local_.reset();
    remote_client_.reset();
    remote_.reset();
  }

  // A fresh cache, a prefill pool of one real worker on its own engine over
  // the in-process plane, a worker on the decode engine for local prefills,
  // and the loop over them. `local` wraps the local worker (the tests make
  // it fail).
  void Start(DecodeLoopOptions options,
             std::function<absl::StatusOr<prefill::KeptPrefill>(prefill::PrefillWorker&, const prefill::PrefillRequest&,
                                                                int64_t)>
                 local = nullptr) {
    TearDown();
    auto store = cachestore::CacheStore::Create(cachestore::CacheIndexOptions(), clock_);
    ASSERT_TRUE(store.ok());
    cache_.reset();
    store_ = *std::move(store);
    cache_ = std::make_unique<cachestore::InProcessCacheClient>(*store_);
    prefill::PrefillWorkerOptions wo;  // puts inline: each turn's publication is done when it answers
    remote_ = std::make_unique<prefill::PrefillWorker>(*prefill_model_, weights_->fingerprint(), cache_.get(),
                                                       transport_, wo);
    remote_client_ = std::make_unique<prefill::InProcessPrefillClient>(*remote_);
    local_ = std::make_unique<prefill::PrefillWorker>(*decode_model_, weights_->fingerprint(), cache_.get(), wo);
    if (!local) {
      local = [](prefill::PrefillWorker& w, const prefill::PrefillRequest& r, int64_t positions) {
        return w.PrefillAndKeep(r, positions);
      };
    }
    auto loop = DecodeLoop::Create(
        *decode_model_, weights_->fingerprint(), *remote_client_, transport_, cache_.get(), options,
        [this, local](const prefill::PrefillRequest& r, int64_t positions) { return local(*local_, r, positions); });
    ASSERT_TRUE(loop.ok()) << loop.status();
    loop_ = *std::move(loop);
  }

  static DecodeLoopOptions Local(int64_t max_tokens = 64) {
    DecodeLoopOptions o;
    o.local_prefill_max_tokens = max_tokens;
    return o;
  }

  Turn Play(const std::string& id, const std::vector<TokenId>& prompt, int64_t max_tokens = 6) {
    Turn out;
    Collector c;
    c.on_token_ = [&](const engine::SampledToken& t) { out.logprobs.push_back(t.logprob); };
    GenerateRequest r = Request(id, prompt, max_tokens);
    r.sampling.logprobs = true;
    EXPECT_TRUE(loop_->Submit(r, &c).ok());
    EXPECT_TRUE(c.Wait());
    EXPECT_EQ(c.completion().reason, FinishReason::kLength) << c.completion().error;
    EXPECT_TRUE(c.completion().usage.session.published);
    out.tokens = c.tokens();
    out.cached_tokens = c.completion().usage.cached_tokens;
    return out;
  }

  // Turn 1 of 40 tokens generating 9, and turn 2's prompt: the conversation
  // so far and `added` new tokens (turn 1's last token is not in the cache
  // yet either: added + 1 uncached tokens).
  std::vector<TokenId> NextPrompt(const std::vector<TokenId>& prompt, const Turn& turn, int64_t added) const {
    std::vector<TokenId> next = prompt;
    next.insert(next.end(), turn.tokens.begin(), turn.tokens.end());
    const std::vector<TokenId> more = Tokens(added, vocab_, 4);
    next.insert(next.end(), more.begin(), more.end());
    return next;
  }

  int64_t PoolCalls() const { return remote_->counters().lookups; }

  std::unique_ptr<prefill::PrefillWorker> remote_, local_;
  std::unique_ptr<prefill::InProcessPrefillClient> remote_client_;
};

// Turn 2 (21 uncached tokens) is prefilled here, turn 1 (nothing cached) by
// the pool; every token and logprob is the pool's path's, bit for bit, and
// turn 3 resumes from what the local prefill and the turn end published.
TEST_F(DecodeLoopLocalPrefillTest, AContinuationIsPrefilledHereWithThePoolsBits) {
  const std::vector<TokenId> first = Tokens(40, vocab_, 3);
  Start(DecodeLoopOptions());  // no local prefill
  const Turn pool1 = Play("turn-1", first, 9);
  // 69 tokens: its fourth full page is in no turn end, only in the pages
  // its prefill publishes.
  const std::vector<TokenId> second = NextPrompt(first, pool1, 20);
  const Turn pool2 = Play("turn-2", second);
  const Turn pool3 = Play("turn-3", NextPrompt(second, pool2, 7));
  EXPECT_EQ(loop_->counts().local_prefills, 0);
  ExpectEverythingFreed();

  Start(Local());
  const Turn here1 = Play("turn-1", first, 9);
  EXPECT_EQ(loop_->counts().local_prefills, 0);  // a new prompt: the pool's
  const int64_t pool_lookups = PoolCalls();
  const Turn here2 = Play("turn-2", second);
  EXPECT_EQ(loop_->counts().local_prefills, 1);
  const Turn here3 = Play("turn-3", NextPrompt(second, here2, 7));
  EXPECT_EQ(loop_->counts().local_prefills, 2);
  EXPECT_EQ(loop_->counts().local_prefill_failures, 0);
  EXPECT_EQ(PoolCalls(), pool_lookups);  // the pool saw neither continuation
  ExpectEverythingFreed();

  EXPECT_EQ(here1.tokens, pool1.tokens);
  EXPECT_EQ(here1.logprobs, pool1.logprobs);
  for (const auto& [here, pool] : {std::pair{here2, pool2}, std::pair{here3, pool3}}) {
    ASSERT_EQ(here.logprobs.size(), 6u);
    EXPECT_EQ(here.tokens, pool.tokens);
    EXPECT_EQ(here.logprobs, pool.logprobs);
    EXPECT_EQ(here.cached_tokens, pool.cached_tokens);
  }
  // Both resumed from the turn end before them: 40 + 8 fed in turn 1.
  EXPECT_EQ(here2.cached_tokens, 48);
  EXPECT_EQ(here2.tokens, Alone(second, 6));
  // The local prefill published as the pool does: turn 2's prompt pages
  // (turn 1's end held three of its four) and its prompt-end state.
  absl::StatusOr<cachestore::LookupResult> probe =
      cache_->Lookup(remote_->Namespace(prefill::PrefillRequest{}), second, cachestore::LookupMode::kProbeOnly);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe->kv_match_tokens, 64);
  EXPECT_EQ(probe->resume_position, static_cast<int64_t>(second.size()));
}

TEST_F(DecodeLoopLocalPrefillTest, ALongerContinuationGoesToThePool) {
  Start(Local(/*max_tokens=*/5));
  const std::vector<TokenId> first = Tokens(40, vocab_, 3);
  const Turn turn1 = Play("turn-1", first, 9);
  const std::vector<TokenId> second = NextPrompt(first, turn1, 5);  // 6 uncached
  const int64_t pool_lookups = PoolCalls();
  const Turn turn2 = Play("turn-2", second);
  EXPECT_EQ(loop_->counts().local_prefills, 0);
  EXPECT_GT(PoolCalls(), pool_lookups);
  EXPECT_EQ(turn2.cached_tokens, 48);
  EXPECT_EQ(turn2.tokens, Alone(second, 6));
  ExpectEverythingFreed();
}

// While another request decodes, a continuation goes to the pool unless
// local prefills may delay the batch; either way every token is right.
TEST_F(DecodeLoopLocalPrefillTest, WhileAnotherRequestDecodesOnlyIfAllowed) {
  for (const bool allowed : {false, true}) {
    SCOPED_TRACE(allowed ? "allowed" : "not allowed");
    DecodeLoopOptions o = Local();
    o.local_prefill_while_decoding = allowed;
    Start(o);
    const std::vector<TokenId> first = Tokens(40, vocab_, 3);
    const Turn turn1 = Play("turn-1", first, 9);
    const std::vector<TokenId> second = NextPrompt(first, turn1, 5);
    // A long request; at its second token (on the loop thread) turn 2
    // arrives, admitted while it decodes.
    const std::vector<TokenId> other_prompt = Tokens(30, vocab_, 8);
    Collector other, turn2;
    other.on_token_ = [&](const engine::SampledToken&) {
      if (other.tokens().size() == 1) {
        EXPECT_TRUE(loop_->Submit(Request("turn-2", second, 6), &turn2).ok());
      }
    };
    ASSERT_TRUE(loop_->Submit(Request("other", other_prompt, 24), &other).ok());
    ASSERT_TRUE(turn2.Wait());
    ASSERT_TRUE(other.Wait());
    EXPECT_EQ(loop_->counts().local_prefills, allowed ? 1 : 0);
    EXPECT_EQ(turn2.completion().usage.cached_tokens, 48);
    EXPECT_EQ(turn2.tokens(), Alone(second, 6));
    EXPECT_EQ(other.tokens(), Alone(other_prompt, 24));
    ExpectEverythingFreed();
  }
}

// A local prefill that fails (here: refused; a cache that failed mid-read
// is a miss inside it) leaves nothing in the engine and the pool takes the
// request.
TEST_F(DecodeLoopLocalPrefillTest, AFailedLocalPrefillGoesToThePool) {
  int attempts = 0;
  Start(Local(), [&](prefill::PrefillWorker&, const prefill::PrefillRequest&, int64_t) {
    ++attempts;
    return absl::ResourceExhaustedError("no room");
  });
  const std::vector<TokenId> first = Tokens(40, vocab_, 3);
  const Turn turn1 = Play("turn-1", first, 9);
  const std::vector<TokenId> second = NextPrompt(first, turn1, 5);
  const Turn turn2 = Play("turn-2", second);
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(loop_->counts().local_prefills, 0);
  EXPECT_EQ(loop_->counts().local_prefill_failures, 1);
  EXPECT_EQ(turn2.cached_tokens, 48);
  EXPECT_EQ(turn2.tokens, Alone(second, 6));
  ExpectEverythingFreed();
}

// A local prefill reserves the pages the request's max_tokens needs: a
// request admitted while it decodes cannot take them, and it decodes to its
// end (without the reservation the other request is admitted into its
// pages and its fifth page is refused).
TEST_F(DecodeLoopLocalPrefillTest, ALocalPrefillReservesThePagesItsTokensNeed) {
  Start(Local());
  const std::vector<TokenId> first = Tokens(40, vocab_, 3);
  const Turn turn1 = Play("turn-1", first, 9);
  const std::vector<TokenId> second = NextPrompt(first, turn1, 5);
  // 54 + 40 positions: 6 of the 128 pages. The filler needs 124 (1900 + 84
  // positions): admitted only once turn 2 has ended.
  Collector turn2, filler;
  turn2.on_token_ = [&](const engine::SampledToken&) {
    if (turn2.tokens().empty())
      EXPECT_TRUE(loop_->Submit(Request("filler", Tokens(1900, vocab_, 6), 84), &filler).ok());
  };
  ASSERT_TRUE(loop_->Submit(Request("turn-2", second, 40), &turn2).ok());
  ASSERT_TRUE(turn2.Wait());
  ASSERT_TRUE(filler.Wait());
  EXPECT_EQ(loop_->counts().local_prefills, 1);
  EXPECT_EQ(turn2.completion().reason, FinishReason::kLength) << turn2.completion().error;
  EXPECT_EQ(turn2.tokens(), Alone(second, 40));
  EXPECT_EQ(filler.completion().reason, FinishReason::kLength) << filler.completion().error;
  ExpectEverythingFreed();
}

}  // namespace
}  // namespace hybridserve::decode::test
