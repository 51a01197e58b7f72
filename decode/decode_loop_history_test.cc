// Decode reading a prompt's cached pages itself (DecodeLoopOptions::
// read_history_pages; transport/transfer.h "Held pages"): the tokens are
// those of a run without it, a prefill that restored the pages sends only
// those after them and one that did not sends every page (decode's steps
// then bit for bit those of a loop that read nothing), a failed read is a
// miss, and a request that ends while its call reads keeps its pages
// reserved until the call has returned.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "common/wait_for.h"
#include "decode/decode_loop.h"
#include "decode/decode_loop_test_fixture.h"
#include "gtest/gtest.h"

namespace hybridserve::decode::test {
namespace {

// A cache whose page reads fail (a cachestore that lost its slabs), in
// front of the real one.
class FailingReadsCache : public ForwardingCache {
 public:
  explicit FailingReadsCache(cachestore::CacheClient& inner) : ForwardingCache(inner) {}
  absl::Status GetInto(uint64_t lease_id, const common::Hash128& key, std::string* out) override {
    return absl::DataLossError("slab gone");
  }
};

// A cache whose page reads stall half way: GetManyScattered writes the first
// half of its pages from the real cache, then waits while held, then writes
// the rest as garbage (late bytes of a read still in flight) and answers OK.
class StalledWriteCache : public StallingCache {
 public:
  explicit StalledWriteCache(cachestore::CacheClient& inner) : StallingCache(inner) {}
  absl::Status GetManyScattered(uint64_t lease_id, absl::Span<const common::Hash128> keys,
                                absl::Span<const cachestore::EntrySegments> out) override {
    const size_t half = keys.size() / 2;
    RETURN_IF_ERROR(inner_.GetManyScattered(lease_id, keys.subspan(0, half), out.subspan(0, half)));
    Stall();
    for (const cachestore::EntrySegments& destination : out.subspan(half)) {
      for (absl::Span<char> segment : destination.segments) std::fill(segment.begin(), segment.end(), '\x7f');
    }
    return absl::OkStatus();
  }
};

class DecodeLoopHistoryTest : public DecodeLoopTest {
 protected:
  static DecodeLoopOptions Reading() {
    DecodeLoopOptions o;
    o.read_history_pages = true;
    o.history_read_min_bytes = 0;  // the tests' prompts are a few pages
    return o;
  }

  // Plays turn 1 (`first` tokens, `generated` tokens) and returns turn 2's
  // prompt: the conversation so far and 5 new tokens. Turn 1's end is in
  // the cache.
  std::vector<TokenId> FirstTurn(int64_t first, int64_t generated = 9) {
    const std::vector<TokenId> prompt = Tokens(first, vocab_, 3);
    Collector c;
    EXPECT_TRUE(loop_->Submit(Request("turn-1", prompt, generated), &c).ok());
    EXPECT_TRUE(c.Wait());
    EXPECT_TRUE(c.completion().usage.session.published);
    std::vector<TokenId> next = prompt;
    const std::vector<TokenId> tokens = c.tokens();
    next.insert(next.end(), tokens.begin(), tokens.end());
    const std::vector<TokenId> more = Tokens(5, vocab_, 4);
    next.insert(next.end(), more.begin(), more.end());
    // Another conversation between the turns writes other bytes into the
    // pages turn 1 freed, so that turn 2's slots hold nothing of turn 1's.
    Collector other;
    EXPECT_TRUE(loop_->Submit(Request("other", Tokens(120, vocab_, 9), 1), &other).ok());
    EXPECT_TRUE(other.Wait());
    return next;
  }
};

// Turn 2's tokens and their logprobs.
struct Turn2 {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
};

class DecodeLoopHistoryStepsTest : public DecodeLoopHistoryTest {
 protected:
  Turn2 Play(const std::string& id, const std::vector<TokenId>& prompt) {
    Turn2 out;
    Collector c;
    c.on_token_ = [&](const engine::SampledToken& t) { out.logprobs.push_back(t.logprob); };
    GenerateRequest r = Request(id, prompt, 6);
    r.sampling.logprobs = true;
    EXPECT_TRUE(loop_->Submit(r, &c).ok());
    EXPECT_TRUE(c.Wait());
    EXPECT_EQ(c.completion().reason, FinishReason::kLength) << c.completion().error;
    out.tokens = c.tokens();
    return out;
  }
};

// A prefill that restored the pages too keeps decode's: it sends only those
// after them. Turn 1 generates one token, so its end holds only prompt pages,
// computed by prefill: turn 2's steps are then bit for bit those of a loop
// that read nothing (a page read wrong, or not at all, changes them).
TEST_F(DecodeLoopHistoryStepsTest, AResumedPromptsCachedPagesAreReadHereAndKept) {
  prefill_->KeepHeldPages();
  StartLoop(Reading());
  const std::vector<TokenId> next = FirstTurn(48, 1);  // turn 1 ends at 48 fed tokens: 3 full pages
  EXPECT_EQ(loop_->counts().history_reads, 0);         // turn 1 found nothing
  const Turn2 kept = Play("turn-2", next);
  const DecodeLoop::Counts counts = loop_->counts();
  EXPECT_EQ(counts.history_reads, 1);
  EXPECT_EQ(counts.history_pages, 3);
  EXPECT_EQ(counts.history_failures, 0);
  ExpectEverythingFreed();
  loop_.reset();
  prefill_->KeepHeldPages(false);
  StartLoop();
  const Turn2 sent = Play("turn-2-sent", next);
  EXPECT_EQ(kept.tokens, Alone(next, 6));
  EXPECT_EQ(kept.tokens, sent.tokens);
  ASSERT_EQ(kept.logprobs.size(), 6u);
  EXPECT_EQ(kept.logprobs, sent.logprobs);
  ExpectEverythingFreed();
}

// A prefill that computed the pages itself sends every one: decode's steps
// are those of a loop that read nothing, bit for bit.
TEST_F(DecodeLoopHistoryStepsTest, PagesPrefillSendsAnywayReplaceTheOnesReadHereBitForBit) {
  StartLoop(Reading());
  const std::vector<TokenId> next = FirstTurn(40);
  const Turn2 read_here = Play("turn-2", next);
  EXPECT_EQ(loop_->counts().history_reads, 1);
  EXPECT_EQ(loop_->counts().history_pages, 0);  // none kept
  ExpectEverythingFreed();
  loop_.reset();
  StartLoop();
  const Turn2 sent = Play("turn-2-sent", next);
  EXPECT_EQ(loop_->counts().history_reads, 0);
  EXPECT_EQ(read_here.tokens, sent.tokens);
  ASSERT_EQ(read_here.logprobs.size(), 6u);
  EXPECT_EQ(read_here.logprobs, sent.logprobs);
  ExpectEverythingFreed();
}

// Below history_read_min_bytes (by default 4 MiB of pages; the tiny model's
// prompts here hold a few KiB) decode does not look the prompt up at all.
TEST_F(DecodeLoopHistoryTest, APromptOfFewPageBytesIsNotReadHere) {
  DecodeLoopOptions o;
  o.read_history_pages = true;
  StartLoop(o);
  const std::vector<TokenId> next = FirstTurn(48, 1);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("turn-2", next, 6), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.tokens(), Alone(next, 6));
  EXPECT_EQ(loop_->counts().history_reads, 0);
  EXPECT_EQ(loop_->counts().history_failures, 0);
  ExpectEverythingFreed();
}

TEST_F(DecodeLoopHistoryTest, AFailedReadIsAMissAndPrefillSendsEveryPage) {
  FailingReadsCache failing(*cache_);
  prefill_->KeepHeldPages();  // would keep what decode claimed to hold
  StartLoop(Reading(), &failing);
  const std::vector<TokenId> next = FirstTurn(40);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("turn-2", next, 6), &c).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.completion().reason, FinishReason::kLength) << c.completion().error;
  EXPECT_EQ(c.tokens(), Alone(next, 6));
  EXPECT_EQ(loop_->counts().history_failures, 1);
  EXPECT_EQ(loop_->counts().history_pages, 0);
  ExpectEverythingFreed();
  loop_.reset();  // before the cache it uses
}

// Aborted while its call reads into the reservation: the pages stay
// reserved until the call returns, then everything is freed.
TEST_F(DecodeLoopHistoryTest, ARequestEndedWhileItsCallReadsFreesItsPagesOnlyAfterTheCallReturns) {
  StalledLookupCache stalled(*cache_);
  StartLoop(Reading(), &stalled);
  const std::vector<TokenId> next = FirstTurn(40);
  stalled.Hold(true);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("turn-2", next, 6), &c).ok());
  ASSERT_TRUE(common::WaitFor([&] { return stalled.blocked() == 1; }));  // the call is in its lookup
  ASSERT_TRUE(loop_->Abort("", "turn-2"));
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.completion().reason, FinishReason::kAborted);
  // Ended, its call still running: its pages are still reserved.
  ASSERT_TRUE(common::WaitFor([&] {
    const DecodeLoop::Counts k = loop_->counts();
    return k.prefilling == 0 && k.orphaned_calls == 1;
  }));
  EXPECT_LT(loop_->counts().free_pages, 128);
  stalled.Hold(false);
  ExpectEverythingFreed();
  EXPECT_TRUE(common::WaitFor([&] { return loop_->counts().free_pages == 128; }));
  loop_.reset();  // before the cache it uses
}

// The same, stalled in the middle of writing the pages into the
// reservation: the request is aborted there, and a request admitted
// meanwhile takes every page left free. The aborted one's pages stay
// reserved until its call returns, so the late bytes land in pages no one
// else holds: the other request's tokens are those of a run alone. (The pool
// hands out the most recently freed pages first, kv_page_pool.cc: pages freed
// at the abort would be the other request's.)
TEST_F(DecodeLoopHistoryTest, ARequestEndedWhileItsCallWritesKeepsItsPagesFromOthersUntilTheCallReturns) {
  StalledWriteCache stalled(*cache_);
  DecodeLoopOptions o = Reading();
  o.history_read_streams = 1;
  StartLoop(o, &stalled);
  const std::vector<TokenId> next = FirstTurn(40);
  stalled.Hold(true);
  Collector c;
  ASSERT_TRUE(loop_->Submit(Request("turn-2", next, 6), &c).ok());
  ASSERT_TRUE(common::WaitFor([&] { return stalled.blocked() == 1; }));  // half its pages written
  ASSERT_TRUE(loop_->Abort("", "turn-2"));
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.completion().reason, FinishReason::kAborted);
  ASSERT_TRUE(common::WaitFor([&] {
    const DecodeLoop::Counts k = loop_->counts();
    return k.prefilling == 0 && k.orphaned_calls == 1;
  }));
  const int64_t reserved = decode_model_->sequences().PagesFor(static_cast<int64_t>(next.size()) + 6);
  // Another request takes pages left free (32 of them: it decodes them all).
  const int64_t page_size = decode_model_->page_size();
  const std::vector<TokenId> prompt = Tokens(30, vocab_, 11);
  const int64_t max_tokens = std::min<int64_t>(128 - reserved, 32) * page_size - 30;
  Collector other;
  ASSERT_TRUE(loop_->Submit(Request("other", prompt, max_tokens), &other).ok());
  ASSERT_TRUE(common::WaitFor([&] { return other.tokens().size() >= 3; })) << "the other request never decoded";
  stalled.Hold(false);  // the late bytes land
  ASSERT_TRUE(other.Wait());
  EXPECT_EQ(other.tokens(), Alone(prompt, max_tokens)) << "the late bytes landed in the other request's pages";
  ExpectEverythingFreed();
  loop_.reset();  // before the cache it uses
}

}  // namespace
}  // namespace hybridserve::decode::test
