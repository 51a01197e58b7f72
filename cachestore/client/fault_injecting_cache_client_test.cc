#include "cachestore/client/fault_injecting_cache_client.h"

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cachestore/client/in_process_cache_client.h"
#include "cachestore/index/cache_store.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 4;

class FaultInjectingCacheClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CacheStore>> store = CacheStore::Create(CacheIndexOptions{}, clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    inner_ = std::make_unique<InProcessCacheClient>(*store_);
    // Delays advance the fake clock instead of sleeping, and are recorded.
    faulty_ = std::make_unique<FaultInjectingCacheClient>(*inner_, [this](absl::Duration d) {
      sleeps_.push_back(d);
      clock_.Advance(d);
    });
  }

  // Puts a state at 2 under the namespace root and returns a lease on it.
  LookupResult PutAndLease() {
    ClientPut state;
    state.entry_class = EntryClass::kState;
    state.tokens = {7, 8};
    state.position = 2;
    EXPECT_TRUE(inner_->Put(ns_, state, "snapshot").ok());
    absl::StatusOr<LookupResult> r = inner_->Lookup(ns_, {7, 8, 9}, LookupMode::kLease);
    EXPECT_TRUE(r.ok() && r->state.has_value()) << r.status();
    return r.ok() ? *r : LookupResult{};
  }

  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  std::unique_ptr<InProcessCacheClient> inner_;
  std::unique_ptr<FaultInjectingCacheClient> faulty_;
  std::vector<absl::Duration> sleeps_;
  const ClientNamespace ns_{"fingerprint", "", "", kPageSize};
};

TEST_F(FaultInjectingCacheClientTest, WithNothingArmedCallsPassThroughUnchanged) {
  const LookupResult leased = PutAndLease();
  absl::StatusOr<LookupResult> r = faulty_->Lookup(ns_, {7, 8, 9}, LookupMode::kProbeOnly);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->resume_position, 2);
  absl::StatusOr<std::string> got = faulty_->Get(leased.lease_id, leased.state->key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "snapshot");
  EXPECT_TRUE(faulty_->Release(leased.lease_id).ok());
  EXPECT_EQ(faulty_->Release(leased.lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sleeps_.empty());
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kLookup), 1);
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kGetInto), 1);
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kRelease), 2);
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kPut), 0);
}

TEST_F(FaultInjectingCacheClientTest, FailNextFailsExactlyThatManyCallsWithoutReachingTheCache) {
  faulty_->FailNext(CacheClientMethod::kLookup, 2, absl::UnavailableError("cachestore down"));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<LookupResult> r = faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease);
    EXPECT_EQ(r.status(), absl::UnavailableError("cachestore down")) << i;
  }
  EXPECT_EQ(store_->Stats().lookups, 0);  // the failed calls never reached the store
  EXPECT_TRUE(faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease).ok());
  EXPECT_EQ(store_->Stats().lookups, 1);
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kLookup), 3);
}

TEST_F(FaultInjectingCacheClientTest, FailuresTargetOnlyTheirMethod) {
  faulty_->FailNext(CacheClientMethod::kPut, 1, absl::DeadlineExceededError("slow"));
  faulty_->FailNext(CacheClientMethod::kStats, 1, absl::InternalError("wrong"));
  EXPECT_TRUE(faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease).ok());
  ClientPut page;
  page.tokens = {1, 2, 3, 4};
  EXPECT_EQ(faulty_->Put(ns_, page, "kv").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store_->Stats().pages.entries, 0);
  EXPECT_TRUE(faulty_->Put(ns_, page, "kv").ok());
  EXPECT_EQ(faulty_->Stats().status().code(), absl::StatusCode::kInternal);
  absl::StatusOr<IndexStats> stats = faulty_->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pages.entries, 1);
}

TEST_F(FaultInjectingCacheClientTest, FailedGetLeavesNoBytesAndLaterGetsSucceed) {
  const LookupResult leased = PutAndLease();
  faulty_->FailNext(CacheClientMethod::kGetInto, 1, absl::DataLossError("bad bytes"));
  std::string out = "previous";
  EXPECT_EQ(faulty_->GetInto(leased.lease_id, leased.state->key, &out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out, "");
  ASSERT_TRUE(faulty_->GetInto(leased.lease_id, leased.state->key, &out).ok());
  EXPECT_EQ(out, "snapshot");
}

TEST_F(FaultInjectingCacheClientTest, ArmingAgainReplacesAndZeroDisarms) {
  faulty_->FailNext(CacheClientMethod::kRelease, 5, absl::UnavailableError("down"));
  faulty_->FailNext(CacheClientMethod::kRelease, 1, absl::AbortedError("again"));
  EXPECT_EQ(faulty_->Release(1).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(faulty_->Release(1).code(), absl::StatusCode::kNotFound);  // reached the store
  faulty_->FailNext(CacheClientMethod::kRelease, 3, absl::UnavailableError("down"));
  faulty_->FailNext(CacheClientMethod::kRelease, 0, absl::UnavailableError("down"));
  EXPECT_EQ(faulty_->Release(1).code(), absl::StatusCode::kNotFound);
}

TEST_F(FaultInjectingCacheClientTest, DelayGoesThroughTheSleepHookBeforeEachCall) {
  faulty_->SetDelay(CacheClientMethod::kLookup, absl::Milliseconds(250));
  const absl::Time start = clock_.Now();
  EXPECT_TRUE(faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease).ok());
  EXPECT_TRUE(faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease).ok());
  EXPECT_TRUE(faulty_->Stats().ok());  // other methods are not delayed
  EXPECT_EQ(sleeps_, (std::vector<absl::Duration>{absl::Milliseconds(250), absl::Milliseconds(250)}));
  EXPECT_EQ(clock_.Now() - start, absl::Milliseconds(500));

  // A delayed call that also fails: slow, then down.
  faulty_->FailNext(CacheClientMethod::kLookup, 1, absl::DeadlineExceededError("timed out"));
  EXPECT_EQ(faulty_->Lookup(ns_, {1}, LookupMode::kLease).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sleeps_.size(), 3u);

  faulty_->SetDelay(CacheClientMethod::kLookup, absl::ZeroDuration());
  EXPECT_TRUE(faulty_->Lookup(ns_, {1, 2, 3}, LookupMode::kLease).ok());
  EXPECT_EQ(sleeps_.size(), 3u);
}

TEST_F(FaultInjectingCacheClientTest, CorruptNextGetsFlipsTheFirstByteOfThatManyGets) {
  const LookupResult leased = PutAndLease();
  faulty_->CorruptNextGets(1);
  absl::StatusOr<std::string> wrong = faulty_->Get(leased.lease_id, leased.state->key);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  std::string expected = "snapshot";
  expected[0] = static_cast<char>(~expected[0]);
  EXPECT_EQ(*wrong, expected);
  absl::StatusOr<std::string> right = faulty_->Get(leased.lease_id, leased.state->key);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(*right, "snapshot");
}

TEST_F(FaultInjectingCacheClientTest, ClearRemovesEveryArmedFault) {
  const LookupResult leased = PutAndLease();
  faulty_->FailNext(CacheClientMethod::kGetInto, 4, absl::UnavailableError("down"));
  faulty_->SetDelay(CacheClientMethod::kGetInto, absl::Seconds(1));
  faulty_->CorruptNextGets(4);
  faulty_->Clear();
  absl::StatusOr<std::string> got = faulty_->Get(leased.lease_id, leased.state->key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "snapshot");
  EXPECT_TRUE(sleeps_.empty());
  EXPECT_EQ(faulty_->calls(CacheClientMethod::kGetInto), 1);
}

}  // namespace
}  // namespace hybridserve::cachestore
