// The decode loop with a second engine playing prefill over the in-process
// data plane: tokens equal to a single-engine run whatever the batch, stop
// conditions, admission limits, aborts and deadlines (cancelling the prefill
// call), and bad input. The turn-end publication: decode_loop_publication_test.

#include "decode/decode_loop.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/wait_for.h"
#include "decode/decode_loop_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/channel_receiver.h"
#include "transport/channel_sender.h"
#include "transport/fake_communicator.h"
#include "transport/routing_sender.h"

namespace hybridserve::decode::test {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

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

// The channel data plane (NCCL or CUDA IPC; here over the in-memory fake
// communicator): the decode worker's receiver puts its channel on each
// ticket, the prefill side routes the ticket by its kind, and the request
// streams the single-engine tokens with everything freed after. (NCCL itself needs GPUs:
// //transport:nccl_communicator_test.)
TEST_F(DecodeLoopTest, TicketsOverTheNcclPlaneStreamTheSingleEngineTokens) {
  transport::FakeCommunicatorFactory factory;
  transport::ChannelReceiverOptions ro;
  ro.default_peer = "prefill-0";
  auto receiver = transport::ChannelStateReceiver::Create(factory, ro);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  transport::ChannelStateSender nccl(factory);
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
  EXPECT_EQ(decode_model_->sequences().num_free_pages(), 128);
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
  EXPECT_TRUE(loop_->Abort("", "p"));
  ASSERT_TRUE(prefilling.Wait());
  EXPECT_EQ(prefilling.completion().reason, FinishReason::kAborted);
  EXPECT_FALSE(loop_->Abort("", "p"));
  // Its prefill call was cancelled, and returned although still held.
  EXPECT_TRUE(common::WaitFor([&] { return prefill_->cancelled() == 1; }));
  prefill_->Release();

  // An abort takes effect within one decode step: aborted from the sink as
  // its Nth token arrives (on the loop's thread, so no step can pass before
  // the Abort), the request ends after at most one more token (the step that
  // token's arrival shares with the rest of the batch).
  constexpr int kAbortAt = 5;
  Collector decoding;
  int seen = 0;
  bool aborted = false;
  decoding.on_token_ = [&](const engine::SampledToken&) {
    if (++seen == kAbortAt) aborted = loop_->Abort("", "d");
  };
  ASSERT_TRUE(loop_->Submit(Request("d", Tokens(30, vocab_, 7), 1500), &decoding).ok());
  ASSERT_TRUE(decoding.Wait());
  EXPECT_TRUE(aborted);
  EXPECT_EQ(decoding.completion().reason, FinishReason::kAborted);
  EXPECT_GE(decoding.tokens().size(), static_cast<size_t>(kAbortAt));
  EXPECT_LE(decoding.tokens().size(), static_cast<size_t>(kAbortAt + 1));

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
  // Past its deadline during the first token: at most the one step more.
  EXPECT_LE(late.tokens().size(), 2u);
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
// A request is known by the client's id within its tenant (decode/tenant.h):
// two tenants may use one id at once, and one's Abort ends only its own;
// the documented 256 bytes are the client's; a refusal names the client's
// id, never the scoped form the loop keys it by; prefill is told the
// client's id and the tenant apart.
TEST_F(DecodeLoopTest, RequestIdsAreTheClientsWithinItsTenant) {
  StartLoop();
  prefill_->Hold();
  const std::string tenant_a = "spiffe://hybridserve.test/tenant_a";
  const std::string tenant_b = "spiffe://hybridserve.test/tenant_b";
  const std::string id(kMaxRequestIdBytes, 'i');
  auto request = [&](const std::string& tenant, const std::string& request_id) {
    GenerateRequest r = Request(request_id, Tokens(12, vocab_, 21), 2);
    r.tenant = tenant;
    return r;
  };
  Collector a, b, refused;
  absl::Status s = loop_->Submit(request(tenant_a, id), &a);
  ASSERT_TRUE(s.ok()) << s;
  s = loop_->Submit(request(tenant_b, id), &b);
  ASSERT_TRUE(s.ok()) << s;

  s = loop_->Submit(request(tenant_a, std::string(kMaxRequestIdBytes + 1, 'i')), &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "request_id has 257 bytes, at most 256");
  s = loop_->Submit(request(tenant_a, id), &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat("request_id \"", id, "\" is already live"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("tenant")));

  ASSERT_TRUE(common::WaitFor([&] { return prefill_->calls() == 2; }));
  EXPECT_THAT(prefill_->callers(),
              ::testing::UnorderedElementsAre(::testing::Pair(tenant_a, id), ::testing::Pair(tenant_b, id)));
  EXPECT_FALSE(loop_->Abort("", id));  // tenant "" has no such request
  EXPECT_TRUE(loop_->Abort(tenant_b, id));
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(b.completion().reason, FinishReason::kAborted);
  prefill_->Release();
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.completion().reason, FinishReason::kLength) << a.completion().error;
  EXPECT_EQ(a.tokens().size(), 2u);
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
  ASSERT_TRUE(loop_->Abort("", "first"));
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

}  // namespace
}  // namespace hybridserve::decode::test
