#include "cachestore/cache_store.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace hybridserve::cachestore {
namespace {

constexpr int32_t kPageSize = 4;

PutSpec StateAt1(const Hash128& ns, int64_t size, TokenId token = 7) {
  PutSpec s;
  s.ns = ns;
  s.page_size = kPageSize;
  s.entry_class = EntryClass::kState;
  s.tokens = {token};
  s.position = 1;
  s.size_bytes = size;
  return s;
}

class CacheStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = CacheStore::Create(CacheIndexOptions{}, clock_);
    ASSERT_TRUE(s.ok());
    store_ = *std::move(s);
  }
  common::FakeClock clock_;
  std::unique_ptr<CacheStore> store_;
  Hash128 ns_ = NamespaceKey("fp", "", "", kPageSize);
};

// Each bad option is refused as INVALID_ARGUMENT by a message that names it
// and the value it got.
TEST_F(CacheStoreTest, RejectsNonsenseOptionsNamingTheOption) {
  struct Case {
    std::function<void(CacheIndexOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](CacheIndexOptions& o) { o.page_budget_bytes = 0; }, "page_budget_bytes must be >= 1, got 0"},
      {[](CacheIndexOptions& o) { o.state_budget_bytes = -5; }, "state_budget_bytes must be >= 1, got -5"},
      {[](CacheIndexOptions& o) { o.page_ttl = absl::ZeroDuration(); }, "page_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.state_ttl = -absl::Seconds(1); }, "state_ttl must be > 0, got -1s"},
      {[](CacheIndexOptions& o) { o.lease_ttl = absl::ZeroDuration(); }, "lease_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.put_timeout = absl::ZeroDuration(); }, "put_timeout must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.max_session_ttl = absl::ZeroDuration(); }, "max_session_ttl must be > 0, got 0"},
      {[](CacheIndexOptions& o) { o.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](CacheIndexOptions& o) { o.blob_pool_bytes = -1; }, "blob_pool_bytes must be >= 0, got -1"},
      {[](CacheIndexOptions& o) { o.pin_quota_bytes = -1; }, "pin_quota_bytes must be >= 0, got -1"},
      {[](CacheIndexOptions& o) { o.pin_budget_bytes = -2; }, "pin_budget_bytes must be >= -1, got -2"},
  };
  for (const Case& c : cases) {
    CacheIndexOptions o;
    c.set(o);
    auto store = CacheStore::Create(o, clock_);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(store.status().message(), c.message);
  }
  // The boundary values are accepted.
  CacheIndexOptions edge;
  edge.page_budget_bytes = 1;
  edge.blob_pool_bytes = 0;
  edge.pin_quota_bytes = 0;
  edge.pin_budget_bytes = -1;
  EXPECT_TRUE(CacheStore::Create(edge, clock_).ok());
}

TEST_F(CacheStoreTest, CommitVerifiesTheStoredBytes) {
  std::string data = "0123456789";
  auto put = store_->BeginPut(StateAt1(ns_, data.size()));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE((*put)->Write(0, data.substr(0, 4)).ok());
  EXPECT_EQ((*put)->Write(5, "x").code(), absl::StatusCode::kInvalidArgument);  // gap
  ASSERT_TRUE((*put)->Write(4, data.substr(4)).ok());
  EXPECT_EQ((*put)->Write(10, "x").code(), absl::StatusCode::kInvalidArgument);  // overrun
  EXPECT_EQ((*put)->Commit(common::Checksum64(data.data(), data.size()) + 1).code(), absl::StatusCode::kDataLoss);
  put->reset();  // the failed put is aborted
  EXPECT_EQ(store_->Stats().states.reserved_bytes, 0);
  EXPECT_EQ(store_->Stats().states.entries, 0);
}

TEST_F(CacheStoreTest, DroppedSessionAbortsAndCommittedOneServesVerifiedBytes) {
  std::string data(1000, 'a');
  {
    auto put = store_->BeginPut(StateAt1(ns_, data.size()));
    ASSERT_TRUE(put.ok());
    ASSERT_TRUE((*put)->Write(0, "aaa").ok());
  }
  EXPECT_EQ(store_->Stats().states.reserved_bytes, 0);
  auto put = store_->BeginPut(StateAt1(ns_, data.size()));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE((*put)->Write(0, data).ok());
  ASSERT_TRUE((*put)->Commit(common::Checksum64(data.data(), data.size())).ok());
  auto r = store_->Lookup(ns_, kPageSize, {7, 8}, true);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->resume_position, 1);
  auto h = store_->OpenVerified(r->lease_id, r->state->key);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(h->blob->data.get()), h->blob->size), data);
  EXPECT_TRUE(store_->CheckInvariants().ok());
}

TEST_F(CacheStoreTest, ConcurrentPutsAndLookupsKeepTheInvariants) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const TokenId token = t * 1000 + i;
        std::string data(64 + i, static_cast<char>(i));
        auto put = store_->BeginPut(StateAt1(ns_, data.size(), token));
        if (!put.ok()) continue;
        if ((*put)->Write(0, data).ok()) (*put)->Commit(common::Checksum64(data.data(), data.size())).IgnoreError();
        auto r = store_->Lookup(ns_, kPageSize, {token}, true);
        if (r.ok() && r->lease_id != 0) {
          EXPECT_TRUE(store_->OpenVerified(r->lease_id, r->state->key).ok());
          EXPECT_TRUE(store_->Release(r->lease_id).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(store_->CheckInvariants().ok());
  EXPECT_EQ(store_->Stats().states.entries, 800);
  EXPECT_EQ(store_->Stats().lookup_hits, 800);
}

}  // namespace
}  // namespace hybridserve::cachestore
