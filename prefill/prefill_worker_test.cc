// The prefill worker against a real CacheStore (in process) and the
// in-process data plane into a second engine that plays decode: each resume
// kind, the cache's contracts (docs/ARCHITECTURE.md section 6, contracts 1 and 2), and a
// cache that is down or wrong.

#include "prefill/prefill_worker.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachestore/client/cache_backoff.h"
#include "cachestore/client/fault_injecting_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "cachestore/keys.h"
#include "common/clock.h"
#include "common/runfiles.h"
#include "engine/model.h"
#include "engine/model_flops.h"
#include "engine/model_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/engine_import.h"
#include "transport/in_process_transport.h"

namespace hybridserve::prefill {
namespace {

using ::testing::HasSubstr;

using common::Runfile;

std::vector<TokenId> Tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  uint64_t x = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15u + 1;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<TokenId>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PrefillWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto weights = engine::ModelWeights::LoadDirectory(Runfile("tests/fixtures/golden/nemotron_h_tiny"));
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = *std::move(weights);
    vocab_ = weights_->config().vocab_size;
    prefill_model_ = NewModel();
    decode_model_ = NewModel();
    reference_ = NewModel();
    auto store = cachestore::CacheStore::Create(cachestore::CacheIndexOptions(), clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    cache_ = std::make_unique<cachestore::InProcessCacheClient>(*store_);
    faults_ = std::make_unique<cachestore::FaultInjectingCacheClient>(*cache_);
    // Faults strike exact calls here: no backoff after a failed one (its own
    // test below).
    PrefillWorkerOptions o;
    o.cache_failure_backoff = absl::ZeroDuration();
    worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  }

  std::unique_ptr<engine::Model> NewModel() {
    engine::ModelOptions o;
    o.page_size = 16;
    o.max_pages = 256;
    o.max_sequences = 4;
    auto m = engine::Model::Create(weights_->config(), *weights_, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  struct Turn {
    absl::StatusOr<PrefillOutcome> outcome;
    engine::SequenceId decode_seq = 0;  // live on decode_model_ when the turn succeeded
  };

  // One request through the worker into decode_model_, greedy.
  Turn Run(const std::vector<TokenId>& prompt, const std::string& salt = "",
           std::function<bool()> cancelled = nullptr) {
    static uint64_t next_transfer = 1;
    Turn turn;
    PrefillRequest request;
    if (cancelled) request.cancellation = std::make_shared<common::Cancellation>(std::move(cancelled));
    request.prompt = prompt;
    request.cache_salt = salt;
    request.sampling.temperature = 0.0f;
    request.sampling.logprobs = true;
    auto reservation = decode_model_->sequences().ReserveImport(static_cast<int64_t>(prompt.size()));
    if (!reservation.ok()) {  // an empty prompt: the worker must refuse it on its own
      turn.outcome = worker_->Prefill(request);
      return turn;
    }
    auto ticket = transport::TicketFor(decode_model_->sequences(), *reservation, next_transfer++, "",
                                       absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(ticket.ok());
    EXPECT_TRUE(transport_.ExpectTicket(&*ticket).ok());
    request.request_id = absl::StrCat("r", ticket->transfer_id);
    request.ticket = *ticket;
    turn.outcome = worker_->Prefill(request);
    if (!turn.outcome.ok()) {
      transport_.Cancel(ticket->transfer_id);
      EXPECT_TRUE(decode_model_->sequences().AbortImport(reservation->id).ok());
      return turn;
    }
    auto received = transport_.Await(ticket->transfer_id);
    EXPECT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->first_token, turn.outcome->first.token);
    EXPECT_TRUE(transport::ImportReceived(decode_model_->sequences(), *reservation, *received).ok());
    turn.decode_seq = reservation->id;
    return turn;
  }

  // Logits of `steps` decode steps, feeding tokens 3, 4, ...
  static std::vector<float> Continue(engine::Model& m, engine::SequenceId id, int steps) {
    std::vector<float> all;
    for (int s = 0; s < steps; ++s) {
      auto l = m.DecodeStep({id}, {static_cast<TokenId>(3 + s)});
      EXPECT_TRUE(l.ok()) << l.status();
      if (!l.ok()) return {};
      all.insert(all.end(), l->begin(), l->end());
    }
    return all;
  }

  // A reference sequence on reference_ prefilled with each chunk in turn.
  engine::SequenceId Reference(const std::vector<std::vector<TokenId>>& chunks, std::vector<float>* last_logits) {
    auto id = reference_->sequences().New();
    EXPECT_TRUE(id.ok());
    for (const auto& chunk : chunks) {
      auto r = reference_->Prefill(*id, chunk);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok() && last_logits != nullptr) *last_logits = r->logits;
    }
    return *id;
  }

  common::FakeClock clock_;
  std::unique_ptr<engine::ModelWeights> weights_;
  int64_t vocab_ = 0;
  std::unique_ptr<engine::Model> prefill_model_, decode_model_, reference_;
  std::unique_ptr<cachestore::CacheStore> store_;
  std::unique_ptr<cachestore::InProcessCacheClient> cache_;
  std::unique_ptr<cachestore::FaultInjectingCacheClient> faults_;
  transport::InProcessTransport transport_;
  std::unique_ptr<PrefillWorker> worker_;
};

TEST_F(PrefillWorkerTest, AsyncPublicationPutsTheSameEntriesBehindTheAnswer) {
  PrefillWorkerOptions o;
  o.async_publication = true;
  o.max_pending_publications = 1;
  worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  const std::vector<TokenId> prompt = Tokens(150, vocab_, 1);
  Turn first = Run(prompt);
  ASSERT_TRUE(first.outcome.ok()) << first.outcome.status();
  ASSERT_TRUE(worker_->WaitForPublications(absl::Seconds(30)));
  EXPECT_EQ(worker_->counters().pages_published, 9);
  EXPECT_EQ(worker_->counters().states_published, 3);
  // Its puts registered the model's cost with the namespace.
  const PrefillCost cost = engine::ModelPrefillCost(weights_->config());
  EXPECT_GT(cost.flops_per_token_context, 0);  // the tiny Nemotron-H has attention
  EXPECT_EQ(store_->ModelCostOf(worker_->Namespace(prefill::PrefillRequest{}).Key()), cost);
  // Its namespace is placed by the prompt's chain: K_0 of its first page, or
  // N for a prompt shorter than a page (ShardedCacheClient places the puts so).
  PrefillRequest placed;
  placed.prompt = prompt;
  const cachestore::ClientNamespace ns = worker_->Namespace(placed);
  EXPECT_EQ(ns.placement, cachestore::PageKey(ns.Key(), absl::MakeConstSpan(prompt).first(16)));
  placed.prompt.resize(15);
  EXPECT_EQ(worker_->Namespace(placed).placement, ns.Key());
  EXPECT_EQ(prefill_model_->sequences().num_free_slots(), 4);  // the bytes were copied out; the sequence is gone
  // What was published behind the answer is what a synchronous worker would
  // have published: the same prompt resumes from its end and continues exactly.
  Turn again = Run(prompt);
  ASSERT_TRUE(again.outcome.ok()) << again.outcome.status();
  EXPECT_EQ(again.outcome->usage.resume_kind, ResumeKind::kExactPrefix);
  EXPECT_EQ(again.outcome->usage.cached_tokens, 150);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, again.decode_seq, 2), Continue(*decode_model_, first.decode_seq, 2)));
}

TEST_F(PrefillWorkerTest, PublicationsStillToDoAreCountedUntilTheyAreDone) {
  PrefillWorkerOptions o;
  o.async_publication = true;
  worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  faults_->SetDelay(cachestore::CacheClientMethod::kPutMany, absl::Seconds(1));  // a slow cachestore
  ASSERT_TRUE(Run(Tokens(150, vocab_, 31)).outcome.ok());
  EXPECT_EQ(worker_->counters().publications_in_flight, 1);  // answered, its puts still under way
  ASSERT_TRUE(worker_->WaitForPublications(absl::Seconds(30)));
  EXPECT_EQ(worker_->counters().publications_in_flight, 0);
  EXPECT_EQ(worker_->counters().pages_published, 9);
}

TEST_F(PrefillWorkerTest, ColdPrefillSendsTheStateAndPublishesPagesCheckpointsAndTheSnapshot) {
  const std::vector<TokenId> prompt = Tokens(150, vocab_, 1);
  Turn turn = Run(prompt);
  ASSERT_TRUE(turn.outcome.ok()) << turn.outcome.status();
  const PrefillUsage& u = turn.outcome->usage;
  EXPECT_EQ(u.prompt_tokens, 150);
  EXPECT_EQ(u.cached_tokens, 0);
  EXPECT_EQ(u.recomputed_tokens, 0);  // nothing was cached to recompute
  EXPECT_EQ(u.resume_kind, ResumeKind::kCold);
  // 9 full pages; checkpoints at 64 and 128 (4 * chunk 16); the prompt-end snapshot.
  EXPECT_EQ(worker_->counters().pages_published, 9);
  EXPECT_EQ(worker_->counters().states_published, 3);
  EXPECT_EQ(prefill_model_->sequences().num_free_slots(), 4);  // the worker keeps nothing

  std::vector<float> logits;
  const engine::SequenceId ref = Reference({prompt}, &logits);
  const TokenId greedy = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(turn.outcome->first.token, greedy);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, turn.decode_seq, 3), Continue(*reference_, ref, 3)));
}

TEST_F(PrefillWorkerTest, TheNextTurnResumesAtTheSnapshotAndContinuesAsAKeptAliveSequence) {
  const std::vector<TokenId> turn1 = Tokens(70, vocab_, 2);
  ASSERT_TRUE(Run(turn1).outcome.ok());
  std::vector<TokenId> turn2 = turn1;
  const std::vector<TokenId> extra = Tokens(25, vocab_, 3);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  Turn turn = Run(turn2);
  ASSERT_TRUE(turn.outcome.ok()) << turn.outcome.status();
  EXPECT_EQ(turn.outcome->usage.cached_tokens, 70);
  EXPECT_EQ(turn.outcome->usage.kv_match_tokens, 64);  // turn 1 published 4 full pages
  EXPECT_EQ(turn.outcome->usage.recomputed_tokens, 0);
  EXPECT_EQ(turn.outcome->usage.resume_kind, ResumeKind::kExactPrefix);
  // Contract 2: bit-identical to a sequence kept alive across the turns.
  const engine::SequenceId kept = Reference({turn1, extra}, nullptr);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, turn.decode_seq, 3), Continue(*reference_, kept, 3)));
}

TEST_F(PrefillWorkerTest, AnIdenticalPromptRecomputesNothing) {
  const std::vector<TokenId> prompt = Tokens(40, vocab_, 4);
  Turn first = Run(prompt);
  ASSERT_TRUE(first.outcome.ok());
  Turn again = Run(prompt);
  ASSERT_TRUE(again.outcome.ok());
  EXPECT_EQ(again.outcome->usage.cached_tokens, 40);
  EXPECT_EQ(again.outcome->usage.recomputed_tokens, 0);
  EXPECT_EQ(again.outcome->first.token, first.outcome->first.token);
  EXPECT_EQ(again.outcome->first.logprob, first.outcome->first.logprob);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, again.decode_seq, 2), Continue(*decode_model_, first.decode_seq, 2)));
}

// A prompt ending on a grid point: its grid checkpoint there and its end
// snapshot have one key. Only the snapshot (with the logits) is published, so
// the same prompt again resumes exactly at its end and computes nothing.
TEST_F(PrefillWorkerTest, APromptEndingOnTheGridPublishesItsEndSnapshotNotAGridCheckpointThere) {
  const std::vector<TokenId> prompt = Tokens(128, vocab_, 41);  // checkpoints at 64 and 128
  Turn first = Run(prompt);
  ASSERT_TRUE(first.outcome.ok()) << first.outcome.status();
  EXPECT_EQ(worker_->counters().states_published, 2);
  Turn again = Run(prompt);
  ASSERT_TRUE(again.outcome.ok()) << again.outcome.status();
  EXPECT_EQ(again.outcome->usage.resume_kind, ResumeKind::kExactPrefix);
  EXPECT_EQ(again.outcome->usage.cached_tokens, 128);
  EXPECT_EQ(again.outcome->usage.recomputed_tokens, 0);
  EXPECT_EQ(again.outcome->first.token, first.outcome->first.token);
  EXPECT_EQ(again.outcome->first.logprob, first.outcome->first.logprob);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, again.decode_seq, 2), Continue(*decode_model_, first.decode_seq, 2)));
}

TEST_F(PrefillWorkerTest, ADivergingPromptResumesAtTheLastSharedGridCheckpointBitIdenticallyToCold) {
  const std::vector<TokenId> a = Tokens(150, vocab_, 5);
  ASSERT_TRUE(Run(a).outcome.ok());
  std::vector<TokenId> b(a.begin(), a.begin() + 130);
  const std::vector<TokenId> tail = Tokens(30, vocab_, 6);
  b.insert(b.end(), tail.begin(), tail.end());
  Turn turn = Run(b);
  ASSERT_TRUE(turn.outcome.ok());
  EXPECT_EQ(turn.outcome->usage.cached_tokens, 128);
  EXPECT_EQ(turn.outcome->usage.resume_kind, ResumeKind::kGridCheckpoint);
  EXPECT_EQ(turn.outcome->usage.kv_match_tokens, 128);
  EXPECT_EQ(turn.outcome->usage.recomputed_tokens, 0);
  // Contract 1: bit-identical to a cold prefill of the whole prompt.
  const engine::SequenceId cold = Reference({b}, nullptr);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, turn.decode_seq, 3), Continue(*reference_, cold, 3)));
}

TEST_F(PrefillWorkerTest, WithoutGridPublicationABranchPointStateIsPublishedWhereAPromptLeavesTheCachedPath) {
  PrefillWorkerOptions o;
  o.cache_failure_backoff = absl::ZeroDuration();
  o.checkpoint_publish_interval = -1;
  worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  // a: 150 tokens, published as 9 pages and its prompt-end state only.
  const std::vector<TokenId> a = Tokens(150, vocab_, 21);
  ASSERT_TRUE(Run(a).outcome.ok());
  EXPECT_EQ(worker_->counters().pages_published, 9);
  EXPECT_EQ(worker_->counters().states_published, 1);
  // b shares a's first 140 tokens: its pages match to 128, no state there, so
  // it prefills cold and publishes the grid checkpoint at the branch (128), its
  // new page 8 and its prompt end; not the checkpoint at 64.
  std::vector<TokenId> b(a.begin(), a.begin() + 140);
  const std::vector<TokenId> b_tail = Tokens(20, vocab_, 22);
  b.insert(b.end(), b_tail.begin(), b_tail.end());
  Turn tb = Run(b);
  ASSERT_TRUE(tb.outcome.ok());
  EXPECT_EQ(tb.outcome->usage.cached_tokens, 0);
  EXPECT_EQ(tb.outcome->usage.kv_match_tokens, 128);
  EXPECT_EQ(worker_->counters().pages_published, 9 + 2);  // pages 8 and 9 of b (160 tokens)
  EXPECT_EQ(worker_->counters().states_published, 1 + 2);
  // c shares the same 140: it resumes at the branch point, bit-identical to a
  // cold prefill (contract 1), and publishes no second state there.
  std::vector<TokenId> c(a.begin(), a.begin() + 140);
  const std::vector<TokenId> c_tail = Tokens(12, vocab_, 23);
  c.insert(c.end(), c_tail.begin(), c_tail.end());
  Turn tc = Run(c);
  ASSERT_TRUE(tc.outcome.ok());
  EXPECT_EQ(tc.outcome->usage.cached_tokens, 128);
  EXPECT_EQ(tc.outcome->usage.resume_kind, ResumeKind::kGridCheckpoint);
  EXPECT_EQ(worker_->counters().states_published, 1 + 2 + 1);  // its prompt end
  const engine::SequenceId cold = Reference({c}, nullptr);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, tc.decode_seq, 3), Continue(*reference_, cold, 3)));
}

TEST_F(PrefillWorkerTest, GridCheckpointsArePublishedAtTheAdmissionInterval) {
  PrefillWorkerOptions o;
  o.checkpoint_publish_interval = 128;  // every other engine checkpoint (64)
  worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  ASSERT_TRUE(Run(Tokens(300, vocab_, 24)).outcome.ok());
  EXPECT_EQ(worker_->counters().states_published, 2 + 1);  // 128, 256 and the prompt end at 300
}

TEST_F(PrefillWorkerTest, PagesCachedBeyondTheDeepestStateAreCountedAsRecomputed) {
  const std::vector<TokenId> a = Tokens(150, vocab_, 11);
  ASSERT_TRUE(Run(a).outcome.ok());
  std::vector<TokenId> b(a.begin(), a.begin() + 146);  // pages 0-8 (144 tokens) match, the state at 150 does not
  b.push_back(static_cast<TokenId>((a[146] + 1) % vocab_));
  Turn turn = Run(b);
  ASSERT_TRUE(turn.outcome.ok());
  EXPECT_EQ(turn.outcome->usage.cached_tokens, 128);
  EXPECT_EQ(turn.outcome->usage.kv_match_tokens, 144);
  EXPECT_EQ(turn.outcome->usage.recomputed_tokens, 16);
}

TEST_F(PrefillWorkerTest, TenantsNeverShareEntries) {
  const std::vector<TokenId> prompt = Tokens(40, vocab_, 7);
  ASSERT_TRUE(Run(prompt, "tenant-a").outcome.ok());
  Turn other = Run(prompt, "tenant-b");
  ASSERT_TRUE(other.outcome.ok());
  EXPECT_EQ(other.outcome->usage.cached_tokens, 0);
}

TEST_F(PrefillWorkerTest, ACacheThatIsDownOrWrongBecomesAMissNeverAFailure) {
  const std::vector<TokenId> prompt = Tokens(90, vocab_, 8);
  ASSERT_TRUE(Run(prompt).outcome.ok());
  const engine::SequenceId cold = Reference({prompt}, nullptr);
  const std::vector<float> expected = Continue(*reference_, cold, 2);

  faults_->FailNext(cachestore::CacheClientMethod::kLookup, 1, absl::UnavailableError("cachestore down"));
  Turn down = Run(prompt);
  ASSERT_TRUE(down.outcome.ok()) << down.outcome.status();
  EXPECT_EQ(down.outcome->usage.cached_tokens, 0);
  // A cache this call could not reach gets nothing from it, and decode is
  // told to publish on its own rather than wait for this worker's pages.
  EXPECT_FALSE(down.outcome->publishes_prompt);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, down.decode_seq, 2), expected));

  faults_->CorruptNextGets(1);  // the state's bytes come back wrong: never restored
  Turn wrong = Run(prompt);
  ASSERT_TRUE(wrong.outcome.ok());
  EXPECT_EQ(wrong.outcome->usage.cached_tokens, 0);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, wrong.decode_seq, 2), expected));

  // The pages' stream fails while the state arrives: nothing restored.
  faults_->FailNext(cachestore::CacheClientMethod::kGetManyInto, 1, absl::UnavailableError("stream reset"));
  Turn torn = Run(prompt);
  ASSERT_TRUE(torn.outcome.ok());
  EXPECT_EQ(torn.outcome->usage.cached_tokens, 0);
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, torn.decode_seq, 2), expected));
  ASSERT_TRUE(decode_model_->sequences().Release(torn.decode_seq).ok());  // the decode model holds four

  faults_->FailNext(cachestore::CacheClientMethod::kPut, 100, absl::ResourceExhaustedError("full"));
  Turn full = Run(Tokens(33, vocab_, 9));
  ASSERT_TRUE(full.outcome.ok()) << full.outcome.status();
  EXPECT_TRUE(full.outcome->publishes_prompt);
  EXPECT_GE(worker_->counters().publish_failures, 1);
  EXPECT_EQ(worker_->counters().publish_failures_by_reason.at("resource_exhausted"),
            worker_->counters().publish_failures);
  EXPECT_EQ(worker_->counters().errors_as_misses, 3);
}

// A concurrent request with the same prefix is putting page 0 (in flight,
// never committed here): this worker's put of it is ABORTED, and the rest of
// its publication, which can hang under the in-flight page, still goes in.
TEST_F(PrefillWorkerTest, APageAnotherWriterIsPuttingDoesNotStopThePublication) {
  const std::vector<TokenId> prompt = Tokens(150, vocab_, 1);
  cachestore::PutSpec spec;
  spec.ns = cachestore::NamespaceKey(weights_->fingerprint().ToHex(), "", "", "", 16);
  spec.page_size = 16;
  spec.entry_class = cachestore::EntryClass::kPage;
  spec.tokens.assign(prompt.begin(), prompt.begin() + 16);
  spec.size_bytes = 64;
  auto other = store_->BeginPut(spec);
  ASSERT_TRUE(other.ok()) << other.status();
  Turn turn = Run(prompt);
  ASSERT_TRUE(turn.outcome.ok()) << turn.outcome.status();
  EXPECT_EQ(worker_->counters().pages_published, 8);  // all 9 but the one in flight
  EXPECT_EQ(worker_->counters().states_published, 3);
  EXPECT_EQ(worker_->counters().publish_failures, 0);
}

// A cachestore that stopped answering in time: the first call that times
// out starts the backoff, and the requests after it neither look up nor
// publish (one timeout, not one per request); each is still served, cold.
// Once the backoff has passed and the cache answers, the next request looks
// up and publishes again.
TEST_F(PrefillWorkerTest, ACacheThatJustTimedOutIsSkippedForTheBackoffThenUsedAgain) {
  common::FakeClock clock;
  PrefillWorkerOptions o;
  o.cache_backoff = std::make_shared<cachestore::CacheBackoff>(absl::Milliseconds(200), clock);
  worker_ = std::make_unique<PrefillWorker>(*prefill_model_, weights_->fingerprint(), faults_.get(), transport_, o);
  faults_->FailNext(cachestore::CacheClientMethod::kLookup, 1000, absl::DeadlineExceededError("cachestore hung"));
  faults_->FailNext(cachestore::CacheClientMethod::kPut, 1000, absl::DeadlineExceededError("cachestore hung"));
  for (int i = 0; i < 3; ++i) {
    Turn t = Run(Tokens(40, vocab_, 30 + i));
    ASSERT_TRUE(t.outcome.ok()) << t.outcome.status();
    EXPECT_EQ(t.outcome->usage.resume_kind, ResumeKind::kCold);
    EXPECT_FALSE(t.outcome->publishes_prompt);
    ASSERT_TRUE(decode_model_->sequences().Release(t.decode_seq).ok());
  }
  EXPECT_EQ(faults_->calls(cachestore::CacheClientMethod::kLookup), 1);
  EXPECT_EQ(faults_->calls(cachestore::CacheClientMethod::kPut), 0);
  faults_->Clear();
  clock.Advance(absl::Milliseconds(200));
  Turn t = Run(Tokens(40, vocab_, 40));
  ASSERT_TRUE(t.outcome.ok()) << t.outcome.status();
  EXPECT_TRUE(t.outcome->publishes_prompt) << "the cache is reached again after the backoff";
  EXPECT_GT(faults_->calls(cachestore::CacheClientMethod::kLookup), 1);
  ASSERT_TRUE(decode_model_->sequences().Release(t.decode_seq).ok());
  ASSERT_TRUE(worker_->WaitForPublications(absl::Seconds(30)));
  EXPECT_GE(worker_->counters().states_published, 1) << "its prompt-end state was published";
}

// A caller that cancels mid-prefill: the worker stops at the next segment
// (the engine's segments end at multiples of the 64-token checkpoint
// interval), answers CANCELLED, pushes nothing, publishes nothing and holds
// nothing; the next request is served as usual.
TEST_F(PrefillWorkerTest, ACancelledCallStopsBetweenSegmentsAndLeavesNothingBehind) {
  int polls = 0;
  Turn t = Run(Tokens(150, vocab_, 21), "", [&] { return ++polls >= 2; });  // before the lookup: no; then yes
  EXPECT_EQ(t.outcome.status().code(), absl::StatusCode::kCancelled) << t.outcome.status();
  EXPECT_EQ(polls, 2) << "polled again after cancelling";
  EXPECT_EQ(worker_->counters().cancelled, 1);
  EXPECT_EQ(worker_->counters().pages_published, 0);
  EXPECT_EQ(worker_->counters().states_published, 0);
  EXPECT_EQ(prefill_model_->sequences().num_free_slots(), 4);
  EXPECT_EQ(prefill_model_->sequences().num_free_pages(), 256);
  Turn next = Run(Tokens(150, vocab_, 21));
  ASSERT_TRUE(next.outcome.ok()) << next.outcome.status();
  EXPECT_EQ(next.outcome->usage.resume_kind, ResumeKind::kCold);
}

TEST_F(PrefillWorkerTest, BadRequestsAreRefusedAndLeaveNothingBehind) {
  Turn empty = Run({});
  EXPECT_EQ(empty.outcome.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<TokenId> bad = Tokens(10, vocab_, 10);
  bad[4] = static_cast<TokenId>(vocab_);
  Turn out_of_range = Run(bad);
  EXPECT_EQ(out_of_range.outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.outcome.status().message(), HasSubstr("prompt_token_ids[4]"));
  EXPECT_EQ(prefill_model_->sequences().num_free_slots(), 4);
  EXPECT_EQ(decode_model_->sequences().num_free_pages(), 256);
}

// PrefillAndKeep, as decode's local prefill runs it on its own engine: the
// next turn resumes at turn 1's snapshot and the kept sequence continues as
// one kept alive (contract 2), its pages reserved for the positions asked;
// bad requests and a reservation the engine cannot give leave nothing; a
// worker without a data plane refuses Prefill.
TEST_F(PrefillWorkerTest, PrefillAndKeepLeavesTheResumedSequenceWithItsPagesReserved) {
  const std::vector<TokenId> turn1 = Tokens(70, vocab_, 2);
  ASSERT_TRUE(Run(turn1).outcome.ok());
  PrefillWorker local(*decode_model_, weights_->fingerprint(), faults_.get());
  std::vector<TokenId> turn2 = turn1;
  const std::vector<TokenId> extra = Tokens(25, vocab_, 3);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  PrefillRequest request;
  request.prompt = turn2;
  request.sampling.temperature = 0.0f;
  const int64_t free_before = decode_model_->sequences().num_free_pages();
  absl::StatusOr<KeptPrefill> kept = local.PrefillAndKeep(request, 95 + 40);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->outcome.usage.cached_tokens, 70);
  EXPECT_EQ(kept->outcome.usage.resume_kind, ResumeKind::kExactPrefix);
  EXPECT_TRUE(kept->outcome.publishes_prompt);
  EXPECT_EQ(kept->outcome.transfer_bytes, 0);
  EXPECT_EQ(decode_model_->sequences().Position(kept->seq).value_or(-1), 95);
  // 135 positions: 9 pages, all taken now.
  EXPECT_EQ(free_before - decode_model_->sequences().num_free_pages(), 9);
  std::vector<float> ref_logits;
  const engine::SequenceId alive = Reference({turn1, extra}, &ref_logits);
  EXPECT_EQ(kept->outcome.first.token,
            static_cast<TokenId>(std::max_element(ref_logits.begin(), ref_logits.end()) - ref_logits.begin()));
  EXPECT_TRUE(BitEqual(Continue(*decode_model_, kept->seq, 3), Continue(*reference_, alive, 3)));
  ASSERT_TRUE(decode_model_->sequences().Release(kept->seq).ok());

  const int64_t slots = decode_model_->sequences().num_free_slots();
  const int64_t pages = decode_model_->sequences().num_free_pages();
  request.prompt = turn2;
  EXPECT_EQ(local.PrefillAndKeep(request, 94).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(local.PrefillAndKeep(request, 1 << 20).status().code(), absl::StatusCode::kResourceExhausted);
  request.prompt[3] = static_cast<TokenId>(vocab_);
  EXPECT_EQ(local.PrefillAndKeep(request, 200).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode_model_->sequences().num_free_slots(), slots);
  EXPECT_EQ(decode_model_->sequences().num_free_pages(), pages);
  request.prompt = turn2;
  EXPECT_EQ(local.Prefill(request).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace hybridserve::prefill
