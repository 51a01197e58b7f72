// The publisher's rules over a real in-process cache (and faults injected in
// front of it): ordered puts, ABORTED pages, parent pages another writer puts
// late (waited out side by side, or given up), failed pages and the states
// that needed them, the skip after a timeout, probes, and backpressure.

#include "cachestore/client/cache_publisher.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cachestore/client/cache_plan.h"
#include "cachestore/client/fault_injecting_cache_client.h"
#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "common/clock.h"
#include "common/wait_for.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 4;

class CachePublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = CacheStore::Create(CacheIndexOptions(), clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    inner_ = std::make_unique<InProcessCacheClient>(*store_);
    faults_ = std::make_unique<FaultInjectingCacheClient>(*inner_);
    ns_ = ModelNamespace{"00112233445566778899aabbccddeeff", "", kPageSize}.For("tenant", "salt", {});
    for (int i = 0; i < 13; ++i) tokens_.push_back(i + 1);
  }

  std::unique_ptr<CachePublisher> NewPublisher(PublisherOptions o = {}) {
    auto p = CachePublisher::Create(*faults_, o);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  // Pages [first, last) of tokens_ and, at each of `states`, a state.
  Publication Make(int64_t first, int64_t last, std::vector<int64_t> states, const std::string& salt = "salt") {
    ClientNamespace ns = ns_;
    ns.cache_salt = salt;
    const CachePlan plan(ns, tokens_);
    Publication p;
    p.ns = ns;
    p.first_page = first;
    for (int64_t i = first; i < last; ++i) p.pages.emplace_back(plan.PagePut(i), std::string(8, 'p'));
    for (int64_t q : states) p.states.emplace_back(plan.StatePut(q, StateKind::kExactPrefix), std::string(8, 's'));
    return p;
  }

  // The deepest resumable position the cache holds for tokens_.
  int64_t ResumeAt() {
    auto lookup = inner_->Lookup(ns_, tokens_, LookupMode::kProbeOnly);
    return lookup.ok() ? lookup->resume_position : -1;
  }
  int64_t PagesHeld() {
    auto lookup = inner_->Lookup(ns_, tokens_, LookupMode::kProbeOnly);
    return lookup.ok() ? lookup->kv_match_tokens / kPageSize : -1;
  }

  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> inner_;
  std::unique_ptr<FaultInjectingCacheClient> faults_;
  ClientNamespace ns_;
  std::vector<TokenId> tokens_;
};

TEST_F(CachePublisherTest, PutsPagesInOrderThenStatesAndReportsEach) {
  auto publisher = NewPublisher();
  PublicationResult r = publisher->PublishNow(Make(0, 3, {4, 12}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(r.pages_put, 3);
  ASSERT_EQ(r.states.size(), 2u);
  EXPECT_TRUE(r.states[0].has_value());
  EXPECT_TRUE(r.states[1].has_value());
  EXPECT_EQ(ResumeAt(), 12);
  // Again: everything already present, nothing counted twice.
  r = publisher->PublishNow(Make(0, 3, {4, 12}));
  EXPECT_EQ(r.pages_put, 0);
  EXPECT_TRUE(r.failure.empty());
  const PublisherCounters c = publisher->counters();
  EXPECT_EQ(c.pages_published, 3);
  EXPECT_EQ(c.states_published, 2);
  EXPECT_EQ(c.failures, 0);
}

// A failed page ends the pages; a state that needed it is not tried, one
// below it still goes in.
TEST_F(CachePublisherTest, AFailedPageEndsThePagesAndTheStatesBelowIt) {
  auto publisher = NewPublisher();
  ASSERT_TRUE(publisher->PublishNow(Make(0, 1, {})).failure.empty());
  faults_->FailNext(CacheClientMethod::kPut, 1, absl::ResourceExhaustedError("full"));
  const int64_t puts_before = faults_->calls(CacheClientMethod::kPut);
  PublicationResult r = publisher->PublishNow(Make(1, 3, {5, 12}));
  EXPECT_EQ(r.failure, "resource_exhausted");
  EXPECT_EQ(r.pages_put, 0);
  EXPECT_TRUE(r.states[0].has_value()) << "the state at 5 hangs under page 0, which is in";
  EXPECT_FALSE(r.states[1].has_value());
  // One PutMany of the failed page 1, page 2, the state at 5 and the state at
  // 12: the answers to page 2 and to the state at 12 (FAILED_PRECONDITION, no
  // parent) are not counted as failures of their own.
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut) - puts_before, 4);
  EXPECT_EQ(publisher->counters().failures_by_reason.at("resource_exhausted"), 1);
  EXPECT_EQ(ResumeAt(), 5);
}

// Pages another writer is putting (ABORTED) are passed; the next pages hang
// under them once their put commits.
TEST_F(CachePublisherTest, AnAbortedPageIsAnotherWritersAndThePagesGoOn) {
  auto publisher = NewPublisher();
  faults_->FailNext(CacheClientMethod::kPut, 1, absl::AbortedError("another writer"));
  PublicationResult r = publisher->PublishNow(Make(0, 3, {12}));
  // Page 0 never arrives: page 1 waits for it as for another writer's, then gives up.
  EXPECT_EQ(r.failure, "failed_precondition");
  EXPECT_TRUE(r.parent_wait_expired);
  EXPECT_EQ(publisher->counters().parent_waits_expired, 1);
}

// A state put another writer's put of the same state is in flight for
// (ABORTED: decode's turn end at the prompt's end beside prefill's
// prompt-end state) is waited out and put again: then it lands, or finds
// the state present. One that stays ABORTED past parent_wait fails.
TEST_F(CachePublisherTest, AnAbortedStateIsPutAgainOnceTheOtherWritersPutHasLanded) {
  PublisherOptions o;
  o.parent_wait = absl::Seconds(30);
  auto publisher = NewPublisher(o);
  ASSERT_TRUE(publisher->PublishNow(Make(0, 3, {})).failure.empty());
  faults_->FailNext(CacheClientMethod::kPut, 2, absl::AbortedError("a put of this state is in flight"));
  const int64_t puts_before = faults_->calls(CacheClientMethod::kPut);
  PublicationResult r = publisher->PublishNow(Make(3, 3, {12}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  ASSERT_EQ(r.states.size(), 1u);
  EXPECT_TRUE(r.states[0].has_value());
  EXPECT_FALSE(r.parent_wait_expired);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut) - puts_before, 3);  // two refused, the third stored
  EXPECT_EQ(ResumeAt(), 12);
  EXPECT_EQ(publisher->counters().failures, 0);

  o.parent_wait = absl::Milliseconds(20);
  auto impatient = NewPublisher(o);
  faults_->FailNext(CacheClientMethod::kPut, 1000, absl::AbortedError("a put of this state is in flight"));
  r = impatient->PublishNow(Make(3, 3, {8}));
  EXPECT_EQ(r.failure, "aborted");
  EXPECT_TRUE(r.parent_wait_expired);
  EXPECT_FALSE(r.states[0].has_value());
}

// The parent is another writer's and arrives late: the publication parks
// while a later one goes through, then completes.
TEST_F(CachePublisherTest, APublicationWaitsForItsParentWithoutHoldingUpOthers) {
  PublisherOptions o;
  o.parent_wait = absl::Seconds(30);
  auto publisher = NewPublisher(o);
  absl::Notification waiting_done, other_done;
  PublicationResult waiting_result;
  Publication waiting = Make(1, 3, {12});
  waiting.parent_from_other_writer = true;
  waiting.done = [&](PublicationResult r) {
    waiting_result = std::move(r);
    waiting_done.Notify();
  };
  publisher->Publish(std::move(waiting));
  // Another namespace's publication: done while the first one waits.
  Publication other = Make(0, 2, {8}, "other");
  other.done = [&](PublicationResult r) {
    EXPECT_TRUE(r.failure.empty()) << r.failure_message;
    other_done.Notify();
  };
  publisher->Publish(std::move(other));
  ASSERT_TRUE(other_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(waiting_done.HasBeenNotified());
  // The other one's done ran just before the publisher let go of it.
  EXPECT_TRUE(common::WaitFor([&] { return publisher->in_flight() == 1; })) << publisher->in_flight();
  // The other writer's page 0 lands.
  ASSERT_TRUE(publisher->PublishNow(Make(0, 1, {})).failure.empty());
  ASSERT_TRUE(waiting_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(waiting_result.failure.empty()) << waiting_result.failure_message;
  EXPECT_EQ(waiting_result.pages_put, 2);
  EXPECT_EQ(ResumeAt(), 12);
  EXPECT_TRUE(publisher->WaitIdle(absl::Seconds(30)));
}

// A timed-out call skips the cache for the backoff: the rest of the
// publication and the next ones fail without a call; once the backoff has
// passed, the next publication reaches the cache again and lands.
TEST_F(CachePublisherTest, ATimeoutSkipsTheCacheForTheBackoffThenReachesItAgain) {
  common::FakeClock clock;
  PublisherOptions o;
  o.backoff = std::make_shared<CacheBackoff>(absl::Milliseconds(200), clock);
  auto publisher = NewPublisher(o);
  faults_->FailNext(CacheClientMethod::kPut, 1, absl::DeadlineExceededError("hung"));
  PublicationResult r = publisher->PublishNow(Make(0, 2, {2}));
  EXPECT_EQ(r.failure, "deadline_exceeded");
  EXPECT_TRUE(publisher->backoff().Skipping());
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 1) << "the state at 2 was skipped without a call";
  r = publisher->PublishNow(Make(0, 2, {8}));
  EXPECT_EQ(r.failure, "unavailable");
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 1);
  clock.Advance(absl::Milliseconds(199));
  EXPECT_EQ(publisher->PublishNow(Make(0, 2, {8})).failure, "unavailable");
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 1);
  // The backoff has passed: the cache is tried again, and it answers.
  clock.Advance(absl::Milliseconds(1));
  r = publisher->PublishNow(Make(0, 2, {8}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_GT(faults_->calls(CacheClientMethod::kPut), 1);
  EXPECT_EQ(ResumeAt(), 8);
  EXPECT_FALSE(publisher->backoff().Note(absl::UnavailableError("down: refused at once, not skipped")));
}

// probe_first: every page from page 0 is handed over; only those the cache
// lacks are put.
TEST_F(CachePublisherTest, AProbePutsOnlyThePagesTheCacheLacks) {
  auto publisher = NewPublisher();
  ASSERT_TRUE(publisher->PublishNow(Make(0, 2, {})).failure.empty());
  const int64_t puts_before = faults_->calls(CacheClientMethod::kPut);
  Publication p = Make(0, 3, {12});
  p.probe_first = true;
  PublicationResult r = publisher->PublishNow(std::move(p));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(r.pages_put, 1);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut) - puts_before, 2);  // page 2 and the state
  EXPECT_EQ(PagesHeld(), 3);
}

// A publication's pages go in PutMany calls of at most max_put_many_bytes.
TEST_F(CachePublisherTest, PagesGoInPutManyCallsOfBoundedBytes) {
  PublisherOptions o;
  o.max_put_many_bytes = 16;  // two 8-byte pages a call
  auto publisher = NewPublisher(o);
  PublicationResult r = publisher->PublishNow(Make(0, 3, {12}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(r.pages_put, 3);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPutMany), 2);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 4);  // 3 pages through PutMany's entries, the state
  EXPECT_EQ(ResumeAt(), 12);
}

// The states go in the PutMany of the pages: a publication is one call.
TEST_F(CachePublisherTest, StatesGoInTheSamePutManyAsThePages) {
  auto publisher = NewPublisher();
  PublicationResult r = publisher->PublishNow(Make(0, 2, {4, 8}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPutMany), 1);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 4);  // the call's entries
  // States alone (their pages are in): one call, no Put of their own.
  r = publisher->PublishNow(Make(2, 2, {9, 10}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPutMany), 2);
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 6);
  EXPECT_EQ(publisher->counters().states_published, 4);
  EXPECT_EQ(ResumeAt(), 10);
}

// A cachestore older than PutMany answers UNIMPLEMENTED: the publisher falls
// back to one Put per page, then and for later publications until
// put_many_recheck has passed.
TEST_F(CachePublisherTest, AnOlderCachestoreWithoutPutManyGetsOnePutPerPage) {
  auto publisher = NewPublisher();
  faults_->FailNext(CacheClientMethod::kPutMany, 1, absl::UnimplementedError("unknown method PutMany"));
  PublicationResult r = publisher->PublishNow(Make(0, 2, {8}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(r.pages_put, 2);
  EXPECT_EQ(ResumeAt(), 8);
  r = publisher->PublishNow(Make(2, 3, {12}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPutMany), 1) << "asked once";
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 5);  // 3 pages, 2 states, each its own Put
  EXPECT_EQ(publisher->counters().failures, 0);
  EXPECT_EQ(ResumeAt(), 12);
}

// After put_many_recheck PutMany is asked again: an upgraded cachestore gets
// the pages in one call once more.
TEST_F(CachePublisherTest, PutManyIsAskedAgainAfterTheRecheckInterval) {
  PublisherOptions o;
  o.put_many_recheck = absl::ZeroDuration();
  auto publisher = NewPublisher(o);
  faults_->FailNext(CacheClientMethod::kPutMany, 1, absl::UnimplementedError("unknown method PutMany"));
  PublicationResult r = publisher->PublishNow(Make(0, 2, {8}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 3);  // 2 pages, 1 state
  r = publisher->PublishNow(Make(2, 3, {12}));
  EXPECT_TRUE(r.failure.empty()) << r.failure_message;
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPutMany), 2) << "asked again, and answered";
  // (The fault-injecting client puts a PutMany's entries through its Put:
  // the page is counted there too.)
  EXPECT_EQ(faults_->calls(CacheClientMethod::kPut), 5);
  EXPECT_EQ(publisher->counters().failures, 0);
  EXPECT_EQ(ResumeAt(), 12);
}

TEST_F(CachePublisherTest, RefusesBadOptions) {
  PublisherOptions o;
  o.max_queued = 0;
  EXPECT_EQ(CachePublisher::Create(*faults_, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.parent_wait = -absl::Seconds(1);
  EXPECT_EQ(CachePublisher::Create(*faults_, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.max_put_many_bytes = -1;
  EXPECT_EQ(CachePublisher::Create(*faults_, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.put_many_recheck = -absl::Seconds(1);
  EXPECT_EQ(CachePublisher::Create(*faults_, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Backpressure: Publish blocks while the publisher holds max_in_flight
// publications, and returns once one of them finishes.
TEST_F(CachePublisherTest, PublishBlocksWhileTheQueueIsFull) {
  // Puts wait at a gate (the fault client's delay hook) until it opens.
  absl::Notification gate;
  FaultInjectingCacheClient gated(*inner_, [&](absl::Duration) { gate.WaitForNotification(); });
  gated.SetDelay(CacheClientMethod::kPut, absl::Nanoseconds(1));
  PublisherOptions o;
  o.max_queued = 1;
  o.max_in_flight = 1;
  auto publisher = CachePublisher::Create(gated, o);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Publish(Make(0, 1, {}));
  // Full: the first publication is held, its put stopped at the gate.
  ASSERT_TRUE(common::WaitFor([&] { return gated.calls(CacheClientMethod::kPut) == 1; }));
  EXPECT_EQ((*publisher)->in_flight(), 1);
  std::atomic<bool> entered{false};
  std::atomic<bool> returned{false};
  std::thread t([&] {
    entered = true;
    (*publisher)->Publish(Make(0, 1, {}, "other salt"));
    returned = true;
  });
  ASSERT_TRUE(common::WaitFor([&] { return entered.load(); }));
  // Nothing can leave while the gate is shut, so the second Publish must
  // still be waiting however long it is given (a bounded look: a Publish that
  // does not block returns within microseconds of entering).
  EXPECT_FALSE(common::WaitFor([&] { return returned.load(); }, absl::Milliseconds(300)))
      << "Publish returned while max_in_flight publications were held";
  EXPECT_EQ((*publisher)->in_flight(), 1) << "the second publication was queued beyond max_in_flight";
  EXPECT_EQ(gated.calls(CacheClientMethod::kPut), 1);
  gate.Notify();
  EXPECT_TRUE(common::WaitFor([&] { return returned.load(); })) << "Publish still blocked after room was made";
  t.join();
  EXPECT_TRUE((*publisher)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ((*publisher)->counters().pages_published, 2);
  EXPECT_EQ(gated.calls(CacheClientMethod::kPut), 2);
}

}  // namespace
}  // namespace hybridserve::cachestore
